// Flight-recorder dumps (comm/flight_recorder.h): one JSON file per communicator and rank,
//
//   <ZCOLL_DUMP_DIR, or $TMPDIR/zcoll-dumps>/zcoll-flight-<communicator id>-rank<R>.json
//
// holding the communicator's id (the same on every rank), rank, size, pid, host, why it was
// written, the timeout, whether (and why) the communicator is broken, and its records, oldest
// first. Written
//   1. by the rank whose collective fails (the watchdog's on_failure; the path is in the error),
//   2. for every live communicator of the process on SIGUSR1 (the handler is installed with the
//      first communicator whose recorder is on and passes the signal on to the one it replaced,
//      e.g. MPICH's; it only posts a semaphore, a thread of its own writes the files), and
//   3. for every live communicator on dump_all() (zcoll.dump()).
// `zcoll report DIR` reads them (python/zcoll/flight.py).
#pragma once
#include <string>
#include <vector>

namespace zcoll {

class Communicator;

// The directory dumps go to (created if missing).
std::string dump_directory();
// Writes `comm`'s dump; returns its path ("" when its recorder is off or writing failed).
std::string dump_communicator(const Communicator& comm, const std::string& reason);
// Every live communicator of the process; the paths written.
std::vector<std::string> dump_all(const std::string& reason);

namespace detail {
// Communicator's constructor / destructor.
void register_for_dumps(const Communicator* comm);
void unregister_for_dumps(const Communicator* comm);
}  // namespace detail

}  // namespace zcoll
