#include "common/env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "common/check.h"

namespace zcoll::env {
namespace {

struct Spec {
  Var var;
  const char* name;
  Kind kind;
  const char* default_value;
  const char* choices;  // kChoice: "a|b|c"
  long long min, max;   // kInt / kBytes
  const char* help;
};

// The one table. Keep docs/environment.md in step with it.
constexpr Spec kSpecs[] = {
    {Var::kCheck, "ZCOLL_CHECK", Kind::kBool, "0", "", 0, 0,
     "exchange a small header before each collective; ranks that disagree all raise MismatchError"},
    {Var::kSegmentBytes, "ZCOLL_SEGMENT_BYTES", Kind::kBytes, "131072", "", 64, 1LL << 30,
     "pipeline segment size of the message-based algorithms"},
    {Var::kPipelineDepth, "ZCOLL_PIPELINE_DEPTH", Kind::kInt, "4", "", 1, 16,
     "receives each pipeline keeps posted ahead"},
    {Var::kSimd, "ZCOLL_SIMD", Kind::kChoice, "auto", "auto|scalar|avx2|avx512", 0, 0,
     "cap the kernels' instruction set (auto: the best the CPU has)"},
    {Var::kWait, "ZCOLL_WAIT", Kind::kChoice, "auto", "auto|spin|yield", 0, 0,
     "how a waiting rank polls: auto yields the core when a machine's ranks outnumber its cores"},
    {Var::kShm, "ZCOLL_SHM", Kind::kBool, "1", "", 0, 0,
     "allow the node-local shared-memory path (0: MPI messages only)"},
    {Var::kShmBytes, "ZCOLL_SHM_BYTES", Kind::kBytes, "4194304", "", 4096, 1LL << 34,
     "shared memory per rank for the shm algorithm"},
    {Var::kShmSingleCopy, "ZCOLL_SHM_SINGLE_COPY", Kind::kBool, "1", "", 0, 0,
     "shm reads other ranks' buffers and writes their results in one copy (process_vm_readv, "
     "process_vm_writev) from 256 KiB, where the kernel allows it (0: always copy through the shared window)"},
    {Var::kRestart, "ZCOLL_RESTART", Kind::kInt, "0", "", 0, 1000000,
     "set by `zcoll run`: 0 on the first launch, k on the k-th restart"},
    {Var::kCheckpointDir, "ZCOLL_CHECKPOINT_DIR", Kind::kString, "", "", 0, 4096,
     "set by `zcoll run --checkpoint-dir`: where the job saves checkpoints and resumes from"},
    {Var::kNodeId, "ZCOLL_NODE_ID", Kind::kString, "", "", 0, 255,
     "this rank's node: ranks on one machine with equal values share a node (shared memory) instead "
     "of MPI's grouping; emulates a cluster on one machine, like NCCL_HOSTID (unset: MPI decides)"},
    {Var::kTrace, "ZCOLL_TRACE", Kind::kString, "", "", 0, 4096,
     "a directory: trace every DDP model's training steps (zcoll.torch) and write the traces there at exit"},
    {Var::kTimeout, "ZCOLL_TIMEOUT", Kind::kInt, "600", "", 0, 31536000,
     "seconds a collective may wait for other ranks before every rank raises zcoll.TimeoutError (0: never)"},
    {Var::kFlightRecorder, "ZCOLL_FLIGHT_RECORDER", Kind::kInt, "256", "", 0, 1 << 20,
     "collectives each communicator's flight recorder keeps (0: off)"},
    {Var::kDumpDir, "ZCOLL_DUMP_DIR", Kind::kString, "", "", 0, 4096,
     "directory for flight-recorder dumps (empty: a zcoll-dumps directory in the temp dir)"},
    {Var::kTelemetry, "ZCOLL_TELEMETRY", Kind::kBool, "1", "", 0, 0,
     "time every message and collective for comm.link_stats() and comm.diagnose() (0: off)"},
    {Var::kMetricsPort, "ZCOLL_METRICS_PORT", Kind::kInt, "0", "", 0, 65535,
     "serve guarded compression's metrics (Prometheus text) on this port + rank (0: off)"},
    {Var::kTopology, "ZCOLL_TOPOLOGY", Kind::kString, "", "", 0, 4096,
     "the probe.json of `zcoll probe` on this job's world: every MPI communicator orders its ring by the "
     "measured links (algorithm ordered_ring; auto uses it when the rank-order ring has a slow hop)"},
};
static_assert(sizeof(kSpecs) / sizeof(kSpecs[0]) == static_cast<int>(Var::kCount), "one Spec per Var");

const Spec& spec(Var var) {
  const int i = static_cast<int>(var);
  ZCOLL_CHECK_LT(i, static_cast<int>(Var::kCount), "unknown environment variable code");
  return kSpecs[i];
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string valid_text(const Spec& s) {
  switch (s.kind) {
    case Kind::kBool:
      return "1 or 0 (also true/false, yes/no, on/off)";
    case Kind::kInt:
      return detail::concat("an integer from ", s.min, " to ", s.max);
    case Kind::kBytes:
      return detail::concat("a byte count from ", s.min, " to ", s.max, " (suffixes K, M, G)");
    case Kind::kString:
      return detail::concat("any text of at most ", s.max, " characters (empty: unset)");
    case Kind::kChoice:
      break;
  }
  std::string c = s.choices;
  std::replace(c.begin(), c.end(), '|', ' ');
  return "one of: " + c;
}

[[noreturn]] void bad(const Spec& s, const std::string& value) {
  throw std::invalid_argument(detail::concat(s.name, "='", value, "' is not valid: expected ", valid_text(s),
                                             ". Fix or unset the environment variable."));
}

long long parse_integer(const Spec& s, const std::string& value) {
  const std::string v = lower(value);
  std::size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(v, &used, 10);
  } catch (const std::exception&) {
    bad(s, value);
  }
  long long scale = 1;
  if (s.kind == Kind::kBytes && used < v.size()) {
    const std::string suffix = v.substr(used);
    if (suffix == "k" || suffix == "kb" || suffix == "kib") scale = 1LL << 10;
    else if (suffix == "m" || suffix == "mb" || suffix == "mib") scale = 1LL << 20;
    else if (suffix == "g" || suffix == "gb" || suffix == "gib") scale = 1LL << 30;
    else bad(s, value);
    used = v.size();
  }
  if (used != v.size() || n < s.min / scale || n > s.max / scale) bad(s, value);
  n *= scale;
  if (n < s.min || n > s.max) bad(s, value);
  return n;
}

// The canonical text of a value: "1"/"0", a decimal integer, or the choice itself.
std::string normalise(const Spec& s, const std::string& value) {
  switch (s.kind) {
    case Kind::kBool: {
      const std::string v = lower(value);
      if (v == "1" || v == "true" || v == "yes" || v == "on") return "1";
      if (v == "0" || v == "false" || v == "no" || v == "off") return "0";
      bad(s, value);
    }
    case Kind::kInt:
    case Kind::kBytes:
      return std::to_string(parse_integer(s, value));
    case Kind::kString:
      if (value.size() > static_cast<std::size_t>(s.max)) bad(s, value);
      return value;
    case Kind::kChoice:
      break;
  }
  const std::string v = lower(value);
  std::string choices = std::string("|") + s.choices + "|";
  if (!v.empty() && choices.find("|" + v + "|") != std::string::npos) return v;
  bad(s, value);
}

struct Value {
  std::string text;  // normalised
  bool from_env = false;
  long long number = 0;
};

// Parsed on first use, all at once, under a lock (torch groups call in from worker threads).
const Value& value(Var var) {
  static std::mutex mu;
  static bool ready = false;
  static Value values[static_cast<int>(Var::kCount)];
  std::lock_guard<std::mutex> lock(mu);
  if (!ready) {
    Value parsed[static_cast<int>(Var::kCount)];
    for (const Spec& s : kSpecs) {
      Value& v = parsed[static_cast<int>(s.var)];
      const char* raw = std::getenv(s.name);
      v.from_env = raw != nullptr && raw[0] != '\0';
      v.text = normalise(s, v.from_env ? raw : s.default_value);
      if (s.kind != Kind::kChoice && s.kind != Kind::kString) v.number = std::stoll(v.text);
    }
    std::copy(std::begin(parsed), std::end(parsed), std::begin(values));
    ready = true;
  }
  return values[static_cast<int>(var)];
}

void require_kind(Var var, bool ok) {
  ZCOLL_CHECK_EQ(ok, true, "environment variable ", spec(var).name, " read as the wrong kind");
}

}  // namespace

bool get_bool(Var var) {
  require_kind(var, spec(var).kind == Kind::kBool);
  return value(var).number != 0;
}

long long get_int(Var var) {
  require_kind(var, spec(var).kind == Kind::kInt || spec(var).kind == Kind::kBytes);
  return value(var).number;
}

const std::string& get_choice(Var var) {
  require_kind(var, spec(var).kind == Kind::kChoice || spec(var).kind == Kind::kString);
  return value(var).text;
}

const std::string& get_string(Var var) {
  require_kind(var, spec(var).kind == Kind::kString);
  return value(var).text;
}

std::vector<Setting> settings() {
  std::vector<Setting> out;
  for (const Spec& s : kSpecs) {
    const Value& v = value(s.var);
    out.push_back({s.name, v.text, v.from_env ? "environment" : "default", valid_text(s), s.help});
  }
  return out;
}

Var find(const std::string& name) {
  for (const Spec& s : kSpecs)
    if (name == s.name) return s.var;
  std::string known;
  for (const Spec& s : kSpecs) known += std::string(known.empty() ? "" : " ") + s.name;
  throw std::invalid_argument("unknown zcoll environment variable '" + name + "'; known: " + known);
}

const char* name_of(Var var) { return spec(var).name; }
Kind kind_of(Var var) { return spec(var).kind; }

std::string normalise(const std::string& name, const std::string& value) { return normalise(spec(find(name)), value); }

}  // namespace zcoll::env
