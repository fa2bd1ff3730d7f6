// The flags that reach the Redis broker, registered once for `zimage submit` and `zimage worker`
// (docs/BROKER.md): --broker URL and --broker-password-file FILE. Why one place: both commands
// must read the same URL and password the same way, with the same usage errors.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "broker/redis_url.h"
#include "zimage/status.h"

namespace zimage::cli {

struct BrokerFlags {
  std::string url = "redis://127.0.0.1:6379";
  std::string password_file;
};

// Adds --broker and --broker-password-file to `cmd`.
void add_broker_flags(CLI::App* cmd, BrokerFlags& f);

// The broker's address from the flags, the password read from --broker-password-file. kUnsupported
// when zimage was built without hiredis (exit 1); a bad URL or password file is kInvalidArgument
// naming the flag (exit 2).
Result<broker::RedisUrl> broker_url(const BrokerFlags& f);

}  // namespace zimage::cli
