// The Status / Result<T> error model is part of the public API (include/zimage/status.h).
#pragma once
#include "zimage/status.h"
