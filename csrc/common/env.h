// Every ZCOLL_* environment variable, parsed in one place with one policy (NCCL_PARAM's idea):
//
//   1. The table in env.cc lists each variable once: name, kind, default, valid values, help.
//   2. A variable is read on first use and cached for the life of the process.
//   3. A bad value is an error, never a silent fallback: std::invalid_argument (ValueError in
//      Python) naming the variable, the value and the valid values.
//   4. An explicit argument beats the environment: callers consult a setting only when the user
//      passed nothing (e.g. Communicator(check=None) reads ZCOLL_CHECK, check=False does not).
//   5. settings() reports every variable, the value in effect and where it came from, for
//      `zcoll info` / `python -m zcoll`.
#pragma once
#include <string>
#include <vector>

namespace zcoll::env {

enum class Var : int {
  kCheck = 0,      // ZCOLL_CHECK          bool     exchange a header before each collective
  kSegmentBytes,   // ZCOLL_SEGMENT_BYTES  bytes    pipeline segment size
  kPipelineDepth,  // ZCOLL_PIPELINE_DEPTH int      receives posted ahead
  kSimd,           // ZCOLL_SIMD           choice   cap the kernels' instruction set
  kWait,           // ZCOLL_WAIT           choice   how ranks wait
  kShm,            // ZCOLL_SHM            bool     allow the shared-memory path
  kShmBytes,       // ZCOLL_SHM_BYTES      bytes    shared memory per rank
  kShmSingleCopy,  // ZCOLL_SHM_SINGLE_COPY bool    shm reads other ranks' buffers directly
  kRestart,        // ZCOLL_RESTART        int      which restart `zcoll run` is on (0: first launch)
  kCheckpointDir,  // ZCOLL_CHECKPOINT_DIR string    where `zcoll run` tells a job to checkpoint
  kNodeId,         // ZCOLL_NODE_ID        string   which ranks count as one node (NCCL_HOSTID's role)
  kTrace,          // ZCOLL_TRACE          string   directory for step traces (zcoll.torch)
  kTimeout,        // ZCOLL_TIMEOUT        int      seconds before a collective fails (0: never)
  kFlightRecorder, // ZCOLL_FLIGHT_RECORDER int     collectives kept per communicator (0: off)
  kDumpDir,        // ZCOLL_DUMP_DIR       string   where flight-recorder dumps go
  kTelemetry,      // ZCOLL_TELEMETRY      bool     per-link and per-rank timing of every message
  kMetricsPort,    // ZCOLL_METRICS_PORT   int      Prometheus port of guarded compression (0: off)
  kTopology,       // ZCOLL_TOPOLOGY       string   a probe.json: link bandwidths for the ordered ring
  kCount
};

// The value in effect (environment, else default). get_bool / get_int / get_choice / get_string
// must match the variable's kind (an invariant: a mismatch throws zcoll::Error).
bool get_bool(Var var);
long long get_int(Var var);
const std::string& get_choice(Var var);
const std::string& get_string(Var var);  // "" when unset

struct Setting {
  std::string name;     // ZCOLL_...
  std::string value;    // the value in effect, normalised ("1", "131072", "auto")
  std::string source;   // "environment" or "default"
  std::string valid;    // what the variable accepts
  std::string help;     // one line
};
// Every variable in table order. Throws on the first bad value (as any get_* would).
std::vector<Setting> settings();

// The variable called `name` (ZCOLL_...); std::invalid_argument listing the known ones.
Var find(const std::string& name);
const char* name_of(Var var);
enum class Kind : int { kBool, kInt, kBytes, kChoice, kString };
Kind kind_of(Var var);

// Parses a value as the variable would (for tests and for Python-side variables).
// Throws std::invalid_argument naming the variable on a bad value.
std::string normalise(const std::string& name, const std::string& value);

}  // namespace zcoll::env
