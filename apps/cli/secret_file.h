// Secrets from files: `zimage serve --api-key-file`, `zimage worker / submit
// --broker-password-file`. Why: a secret on the command line (--api-key KEY, a password inside
// --broker redis://:PW@host) is visible to every local user in `ps` and /proc/PID/cmdline; a file
// readable by its owner alone is not.
#pragma once

#include <string>

#include "broker/redis_url.h"
#include "zimage/status.h"

namespace zimage::cli {

// The secret in `path` for the flag `flag`: the whole file with one trailing newline ("\n" or
// "\r\n") removed. kInvalidArgument naming the flag and the file when it is missing, not a
// regular file, unreadable, empty (or only a newline), larger than 64 KiB, or holds a control
// character (a secret is one line; a stray "\r" or second line is almost always a mistake).
Result<std::string> read_secret_file(const std::string& flag, const std::string& path);

// --broker-password-file FILE (empty: nothing to do): the Redis password read from FILE into
// `url`. A --broker URL that already holds a password is a usage error (one source, not two).
Status apply_broker_password_file(const std::string& path, broker::RedisUrl* url);

}  // namespace zimage::cli
