// The public API's last line of defence: an exception from a library or an allocation
// (std::bad_alloc) becomes a Status naming the call, so nothing escapes include/zimage/zimage.h.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "core/status.h"

namespace zimage {

template <typename F>
inline auto guarded(const char* call, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return OutOfMemory(std::string(call) + ": out of host memory");
  } catch (const std::exception& e) {
    return InternalError(std::string(call) + ": unexpected exception: " + e.what());
  } catch (...) {
    return InternalError(std::string(call) + ": unexpected exception");
  }
}

}  // namespace zimage
