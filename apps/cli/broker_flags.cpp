// See broker_flags.h.
#include "broker_flags.h"

#include "broker/redis_client.h"
#include "secret_file.h"

namespace zimage::cli {

void add_broker_flags(CLI::App* cmd, BrokerFlags& f) {
  cmd->add_option("--broker", f.url,
                  "Redis URL redis://[[user]:password@]host[:port][/db] (default "
                  "redis://127.0.0.1:6379; a password in it shows in `ps`: prefer "
                  "--broker-password-file)");
  cmd->add_option("--broker-password-file", f.password_file,
                  "The Redis password, read from this file (one line; a trailing newline is "
                  "dropped) instead of the --broker URL");
}

Result<broker::RedisUrl> broker_url(const BrokerFlags& f) {
  if (!broker::have_hiredis())
    return Unsupported(
        "zimage was built without hiredis: the broker commands need it (install "
        "libhiredis-dev, e.g. with scripts/setup.sh, and configure again)");
  auto url = broker::parse_redis_url(f.url);
  if (!url.ok()) return InvalidArgument("--broker: " + url.status().message());
  ZI_TRY(apply_broker_password_file(f.password_file, &*url));
  return url;
}

}  // namespace zimage::cli
