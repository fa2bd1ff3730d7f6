// Runs a program (usually the `zimage` binary) as a child process for end-to-end CLI tests:
// arguments without a shell, extra or removed environment variables, stdin from a string, stdout
// and stderr captured apart. start()/wait() let tests run several children at once.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace zimage::test {

struct ProgramRun {
  int exit_code = -1;  // -1: killed by a signal or could not start
  std::string out, err;
};

struct ProgramSpec {
  std::string exe;
  std::vector<std::string> args;
  // Variables to set (value) or remove (nullopt) on top of this process's environment.
  std::map<std::string, std::optional<std::string>> env;
  std::string stdin_text;
};

// A started child; wait() collects it.
struct RunningProgram {
  pid_t pid = -1;
  std::string scratch;  // folder holding its stdin / stdout / stderr files
};

RunningProgram start_program(const ProgramSpec& spec);
ProgramRun wait_program(const RunningProgram& running);
ProgramRun run_program(const ProgramSpec& spec);

// The whole content of a file ("" when it cannot be read).
std::string read_file_bytes(const std::string& path);

}  // namespace zimage::test
