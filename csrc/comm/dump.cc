#include "comm/dump.h"

#include <semaphore.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "comm/communicator.h"
#include "common/check.h"
#include "common/env.h"

namespace zcoll {
namespace {

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}
std::set<const Communicator*>& registry() {
  static std::set<const Communicator*> comms;
  return comms;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void make_directories(const std::string& path) {
  for (std::size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0777);  // EEXIST is fine
}

std::string hostname() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// Writes a file whole (temp file + rename), so a reader never sees half a dump.
bool write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return false;
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

// ---- SIGUSR1 -----------------------------------------------------------------------------
// The handler only posts a semaphore (async-signal-safe) and passes the signal on to the
// handler it replaced (MPICH installs one at MPI_Init); a thread waiting on the semaphore writes.
sem_t g_dump_semaphore;
struct sigaction g_previous {};

void on_dump_signal(int sig, siginfo_t* info, void* context) {
  sem_post(&g_dump_semaphore);
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler) {
    g_previous.sa_handler(sig);
  }
}

void dumper_thread() {
  for (;;) {
    if (sem_wait(&g_dump_semaphore) != 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (const std::string& path : dump_all("SIGUSR1"))
      std::fprintf(stderr, "zcoll: flight recorder dumped to %s\n", path.c_str());
  }
}

// Once per process, with the first communicator whose recorder is on. A program that sets its
// own SIGUSR1 handler later replaces this one.
void install_dump_signal() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (sigaction(SIGUSR1, nullptr, &g_previous) != 0 || g_previous.sa_handler == SIG_IGN) return;
    if (sem_init(&g_dump_semaphore, 0, 0) != 0) return;
    try {
      std::thread(dumper_thread).detach();
    } catch (const std::exception&) {
      return;
    }
    struct sigaction action {};
    action.sa_sigaction = on_dump_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_SIGINFO;
    sigaction(SIGUSR1, &action, nullptr);
  });
}

}  // namespace

std::string dump_directory() {
  std::string dir = env::get_string(env::Var::kDumpDir);
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/zcoll-dumps";
  }
  make_directories(dir);
  return dir;
}

std::string dump_communicator(const Communicator& comm, const std::string& reason) {
  if (comm.recorder().capacity() == 0) return "";
  const Watchdog& w = comm.watchdog();
  const std::string id = comm.id().empty() ? "unnamed" : comm.id();
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  std::string text = "{\n";
  text += "\"format\": \"zcoll-flight-recorder\", \"version\": 1,\n";
  text += detail::concat("\"comm\": ", json_string(id), ", \"rank\": ", comm.id_rank(), ", \"size\": ", comm.id_size(),
                         ", \"pid\": ", getpid(), ", \"host\": ", json_string(hostname()), ",\n");
  text += detail::concat("\"reason\": ", json_string(reason), ",\n");
  char time_text[64];
  std::snprintf(time_text, sizeof time_text, "%.6f", static_cast<double>(now.tv_sec) + now.tv_nsec / 1e9);
  text += detail::concat("\"time\": ", time_text, ", \"timeout\": ", w.timeout(),
                         ", \"broken\": ", w.broken() ? "true" : "false", ",\n");
  text += "\"calls\": " + comm.recorder().json_calls() + "\n}\n";
  const std::string path = detail::concat(dump_directory(), "/zcoll-flight-", id, "-rank", comm.id_rank(), ".json");
  return write_file(path, text) ? path : "";
}

std::vector<std::string> dump_all(const std::string& reason) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> paths;
  for (const Communicator* comm : registry()) {
    const std::string path = dump_communicator(*comm, reason);
    if (!path.empty()) paths.push_back(path);
  }
  return paths;
}

namespace detail {

void register_for_dumps(const Communicator* comm) {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().insert(comm);
  }
  if (comm->recorder().capacity() > 0) install_dump_signal();
}

void unregister_for_dumps(const Communicator* comm) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(comm);
}

}  // namespace detail
}  // namespace zcoll
