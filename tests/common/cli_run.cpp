// See cli_run.h. The child's output goes to files in a scratch folder rather than pipes, so two
// children writing a lot at once cannot block on a pipe nobody reads.
#include "common/cli_run.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

extern char** environ;

namespace zimage::test {

namespace fs = std::filesystem;

std::string read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

RunningProgram start_program(const ProgramSpec& spec) {
  static std::atomic<int> counter{0};
  RunningProgram r;
  r.scratch = (fs::temp_directory_path() /
               ("zimage_cli_run_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                  .string();
  fs::remove_all(r.scratch);
  fs::create_directories(r.scratch);
  std::ofstream(r.scratch + "/stdin", std::ios::binary) << spec.stdin_text;

  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (spec.env.count(key) == 0) env_strings.push_back(kv);
  }
  for (const auto& [key, value] : spec.env)
    if (value) env_strings.push_back(key + "=" + *value);
  std::vector<std::string> args = spec.args;
  std::string exe = spec.exe;
  std::vector<char*> argv{exe.data()}, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  const std::string in = r.scratch + "/stdin", out = r.scratch + "/stdout",
                    err = r.scratch + "/stderr";
  r.pid = ::fork();
  if (r.pid == 0) {
    const int fi = ::open(in.c_str(), O_RDONLY);
    const int fo = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int fe = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fi < 0 || fo < 0 || fe < 0) ::_exit(126);
    ::dup2(fi, 0);
    ::dup2(fo, 1);
    ::dup2(fe, 2);
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  return r;
}

ProgramRun wait_program(const RunningProgram& running) {
  ProgramRun r;
  if (running.pid > 0) {
    int status = 0;
    if (::waitpid(running.pid, &status, 0) == running.pid && WIFEXITED(status))
      r.exit_code = WEXITSTATUS(status);
  }
  r.out = read_file_bytes(running.scratch + "/stdout");
  r.err = read_file_bytes(running.scratch + "/stderr");
  std::error_code ec;
  fs::remove_all(running.scratch, ec);
  return r;
}

ProgramRun run_program(const ProgramSpec& spec) {
  return wait_program(start_program(spec));
}

}  // namespace zimage::test
