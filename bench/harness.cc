#include "harness.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include "collectives/link_stats.h"
#include "collectives/options.h"
#include "config.h"
#include "kernels/reduce.h"
#include "kernels/simd_level.h"

#if ZCOLL_WITH_SMPI
#include <smpi/smpi.h>
#include <smpi/smpi_helpers_internal.h>
#endif

namespace zcoll::bench {
namespace {

// Under SimGrid's SMPI (build/smpi, docs/scale.md) every simulated rank lives in one process: the
// buffers are SMPI's shared malloc (one physical block however many ranks and bytes, so contents
// are meaningless and results are not checked), nothing is filled, and time is simulated time.
constexpr bool kSimulated = ZCOLL_WITH_SMPI;

struct Args {
  std::size_t min_bytes = 4 << 10;
  std::size_t max_bytes = 64 << 20;
  double factor = 2.0;
  int iters = 20;
  int warmup = 5;
  int check = kSimulated ? 0 : 1;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::vector<std::string> algorithms;  // row names: zcoll algorithms, -z variants, then "mpi"
  std::vector<std::string> lossy;       // the -z variants among them (checked against a bound)
  std::vector<std::string> from_all;    // the algorithms "-a all" added
  bool z_columns = false;               // -z given: wire bytes, ratio and error columns
  int root = 0;
  bool in_place = false;
  double max_seconds = 30.0;
  std::string csv;
  std::string link_stats;             // --link-stats FILE: comm.link_stats()'s rows after the sweep
  std::vector<std::string> toggles;  // --off: features measured off beside on ("deadlines")
};

// --off FEATURE adds, for every row, a twin row "<row>/-FEATURE" run with that feature of zcoll
// switched off for its calls only, interleaved with the row itself (measure_row), so one run
// measures the feature's cost on a quiet and a noisy machine alike.
//   deadlines: the watchdog (comm/watchdog.h): deadlines, liveness checks, MPI_Iallreduce
//   telemetry: the link telemetry (comm/telemetry.h): a clock read per message and per call
//   recorder:  the flight recorder (comm/flight_recorder.h)
const std::vector<std::string> kToggles = {"deadlines", "telemetry", "recorder"};

// Switches a feature off while alive ("" : nothing).
class FeatureOff {
 public:
  FeatureOff(MpiCommunicator& comm, const std::string& feature) : comm_(comm), feature_(feature) { set(false); }
  ~FeatureOff() { set(true); }
  FeatureOff(const FeatureOff&) = delete;
  FeatureOff& operator=(const FeatureOff&) = delete;

 private:
  void set(bool on) {
    if (feature_ == "deadlines") comm_.watchdog().set_enabled(on);
    if (feature_ == "telemetry") comm_.telemetry().set_enabled(on);
    if (feature_ == "recorder") comm_.recorder().set_enabled(on);
  }

  MpiCommunicator& comm_;
  std::string feature_;
};

// Runs the row called `name` once: "ring", "int8", or a twin "ring/-deadlines". The reference
// row "mpi" is MPI_Allreduce itself: zcoll's watchdog off (with it on, zcoll's "mpi" algorithm
// runs MPI_Iallreduce so that its wait has a deadline).
void run_row(MpiCommunicator& comm, const CollectiveBench& b, const Args& a, const std::string& name, Buffers buf,
             std::size_t count) {
  const auto slash = name.find("/-");
  const std::string algorithm = name.substr(0, slash);
  const std::string off = slash == std::string::npos ? (name == "mpi" ? "deadlines" : "") : name.substr(slash + 2);
  FeatureOff feature(comm, off);
  b.run(comm, algorithm, buf, count, a.dtype, a.op, a.root, a.in_place);
}

void print_help(const CollectiveBench& b, const char* prog) {
  std::printf(
      "usage: mpirun -n P %s [flags]\n\n"
      "Measures zcoll's %s against the MPI library's own, side by side, in the manner of\n"
      "nccl-tests. Each row: median over -n iterations of the slowest rank's time.\n\n"
      "  -b SIZE    smallest size in bytes (suffixes K, M, G; default 4K)\n"
      "  -e SIZE    largest size in bytes (default 64M)\n"
      "  -f FACTOR  multiply the size by FACTOR between rows (default 2)\n"
      "  -n ITERS   timed iterations per row (default 20)\n"
      "  -w ITERS   warm-up iterations per row, not timed (default 5)\n"
      "  -c 0|1     check every result element against the exact answer (default 1);\n"
      "             the #wrong column counts wrong elements over all ranks, exit status 1 if any\n"
      "  -d DTYPE   float32 float64 float16 bfloat16 int8 uint8 int32 int64 (default float32)\n"
      "  -o OP      sum prod min max avg (default sum)%s\n"
      "  -a ALGOS   comma-separated algorithms: %s, mpi, or all (default all: those\n"
      "             this placement can run); mpi is always measured, as the reference of vs_mpi\n"
      "%s"
      "  -r ROOT    root rank for rooted collectives (default 0)\n"
      "  -i         in-place (default out-of-place)\n"
      "  -t SECONDS stop timing a row after this long, keeping the iterations done (default 30);\n"
      "             the iters column shows how many were timed\n"
      "  --off FEATURE  also measure every row with FEATURE of zcoll switched off, interleaved\n"
      "             with the row itself (rows named ROW/-FEATURE; repeatable): deadlines,\n"
      "             telemetry, recorder. E.g. the telemetry's cost: -a ring -b 4K -e 64M --off telemetry\n"
      "  --csv FILE also write the table as CSV (rank 0)\n"
      "  --link-stats FILE  after the sweep, write the link telemetry of every rank (the rows of\n"
      "             comm.link_stats(), csrc/collectives/link_stats.h) and each rank's node as JSON\n"
      "             (rank 0), for zcoll.core.diagnose (needs ZCOLL_TELEMETRY on, the default)\n"
      "  -h, --help this text\n\n"
      "Columns: size (bytes of the whole buffer, nccl-tests' S), count (elements), algbw = S/time,\n"
      "busbw = algbw x %s (GB = 1e9 bytes), #wrong, vs_mpi = mpi time / this time.\n"
      "%s"
      "Environment: ZCOLL_WAIT=spin|yield|auto (how ranks wait), ZCOLL_SIMD=scalar|avx2|avx512,\n"
      "ZCOLL_TOPOLOGY=probe.json (the links ordered_ring orders its ring by; see `zcoll probe`).\n",
      prog, b.name, b.reduces ? "" : " (ignored)", [&] {
        static std::string s;
        s.clear();
        for (const auto& a : b.algorithms) s += (s.empty() ? "" : ", ") + a;
        return s.c_str();
      }(),
      !b.check_variant ? ""
                       : "  -z LIST    comma-separated compressed variants, one row each: none fp16 bf16\n"
                         "             int8[:block] int4[:block] sign[:block] int8s int4s (stochastic)\n"
                         "             topk:RATIO topk_exact:RATIO randomk:RATIO threshold:T; NAME@hierarchical:\n"
                         "             fp16, bf16 or a quantizer on the hierarchical allreduce's inter-node\n"
                         "             stage (e.g. int8@hierarchical); 'none' adds\n"
                         "             the uncompressed zcoll rows (-a, default auto). Adds the columns\n"
                         "             wire (bytes sent per rank per call, mean over ranks), ratio (bytes\n"
                         "             of an uncompressed ring / wire), maxerr and relerr (max |result -\n"
                         "             exact|, and over max |exact|); #wrong then counts elements outside\n"
                         "             the variant's documented error bound (docs/algorithms.md)\n",
      b.bus_factor(4) == 1.0 ? "1" : (b.bus_factor(4) > 1.2 ? "2(p-1)/p" : "(p-1)/p"),
      !b.check_variant ? "" : "With -z: wire, ratio, maxerr, relerr (see -z).\n");
}

std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suffix(end);
  if (suffix == "K" || suffix == "k") v *= 1024;
  else if (suffix == "M" || suffix == "m") v *= 1024 * 1024;
  else if (suffix == "G" || suffix == "g") v *= 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) throw std::invalid_argument("bad size '" + s + "' (use e.g. 4096, 64K, 16M)");
  return static_cast<std::size_t>(v);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Returns false when --help was given.
bool parse_args(int argc, char** argv, const CollectiveBench& b, Args& a) {
  std::string algos = "all", variants;
  bool algos_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("flag " + f + " needs a value");
      return argv[++i];
    };
    if (f == "-h" || f == "--help") return false;
    else if (f == "-b") a.min_bytes = parse_size(value());
    else if (f == "-e") a.max_bytes = parse_size(value());
    else if (f == "-f") a.factor = std::stod(value());
    else if (f == "-n") a.iters = std::stoi(value());
    else if (f == "-w") a.warmup = std::stoi(value());
    else if (f == "-c") a.check = std::stoi(value());
    else if (f == "-d") a.dtype = parse_dtype(value());
    else if (f == "-o") a.op = parse_op(value());
    else if (f == "-a") algos = value(), algos_given = true;
    else if (f == "-z" && b.check_variant) variants = value(), a.z_columns = true;
    else if (f == "-r") a.root = std::stoi(value());
    else if (f == "-i") a.in_place = true;
    else if (f == "-t") a.max_seconds = std::stod(value());
    else if (f == "--csv") a.csv = value();
    else if (f == "--link-stats") a.link_stats = value();
    else if (f == "--off") {
      const std::string feature = value();
      if (std::find(kToggles.begin(), kToggles.end(), feature) == kToggles.end())
        throw std::invalid_argument("unknown feature '" + feature + "' for --off (see --help)");
      a.toggles.push_back(feature);
    }
    else throw std::invalid_argument("unknown flag '" + f + "' (see --help)");
  }
  if (a.factor <= 1.0) throw std::invalid_argument("-f must be > 1");
  if (a.iters < 1) throw std::invalid_argument("-n must be >= 1");
  if (a.min_bytes > a.max_bytes) throw std::invalid_argument("-b must not exceed -e");
  if (kSimulated && a.check)
    throw std::invalid_argument("-c 1 cannot check an SMPI simulation: its ranks share one buffer (use -c 0)");
  if (b.reduces) validate_op(a.dtype, a.op);
  const std::vector<std::string> z = split_list(variants);
  const bool with_none = std::find(z.begin(), z.end(), "none") != z.end();
  if (a.z_columns && !algos_given) algos = with_none ? "auto" : "";
  for (const auto& name : split_list(algos)) {
    if (name == "all") {
      a.algorithms.insert(a.algorithms.end(), b.algorithms.begin(), b.algorithms.end());
      a.from_all = b.algorithms;
      continue;
    }
    if (name != "mpi" && std::find(b.algorithms.begin(), b.algorithms.end(), name) == b.algorithms.end())
      throw std::invalid_argument("unknown algorithm '" + name + "' for " + b.name + " (see --help)");
    if (name != "mpi") a.algorithms.push_back(name);
  }
  if (a.z_columns && z.empty()) throw std::invalid_argument("-z needs at least one variant (see --help)");
  for (const auto& name : z) {
    if (name == "none") continue;
    b.check_variant(name, a.dtype, a.op);
    a.algorithms.push_back(name);
    a.lossy.push_back(name);
  }
  const std::vector<std::string> rows = a.algorithms;
  for (const auto& feature : a.toggles)
    for (const auto& row : rows) a.algorithms.push_back(row + "/-" + feature);
  a.algorithms.push_back("mpi");  // always measured: the reference column
  return true;
}

struct AlignedBuffer {
  // `name` tells SMPI's shared malloc the buffers apart (it keys a shared block by call site).
  AlignedBuffer(std::size_t bytes, const char* name) {
    const std::size_t size = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
#if ZCOLL_WITH_SMPI
    ptr = smpi_shared_malloc(size, name, 0);
#else
    static_cast<void>(name);
    ptr = std::aligned_alloc(64, size);
    std::memset(ptr, 0, size);  // first touch now, not while timing
#endif
  }
  ~AlignedBuffer() {
#if ZCOLL_WITH_SMPI
    smpi_shared_free(ptr);
#else
    std::free(ptr);
#endif
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  void* ptr;
};

double now() {
  if (kSimulated) return MPI_Wtime();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Row {
  double time_us = 0;
  long long wrong = 0;
  int iters = 0;
  double wire = 0;                  // bytes sent through zcoll per rank per call (mean over ranks)
  double max_abs = 0, max_ref = 0;  // -z: error against the exact result (max over ranks)
};

// Bytes one run sends through zcoll's communicator, mean over ranks (0 for MPI's own).
double wire_of_run(MpiCommunicator& comm, const std::function<void()>& run) {
  const std::uint64_t before = comm.stats().bytes_sent;
  run();
  double mine = static_cast<double>(comm.stats().bytes_sent - before), sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, comm.comm());
  return sum / comm.size();
}

bool is_lossy(const Args& a, const std::string& row) {
  const std::string variant = row.substr(0, row.find("/-"));  // a twin row runs the same variant
  return std::find(a.lossy.begin(), a.lossy.end(), variant) != a.lossy.end();
}

// Runs once on fresh inputs; counts wrong elements (bitwise, or for lossy variants outside
// their bound) and the error over all ranks, and the bytes sent.
Row check_once(MpiCommunicator& comm, const CollectiveBench& b, const Args& a, const std::string& algo,
               Buffers buf, std::size_t count, void* expected, std::size_t out_bytes) {
  const int p = comm.size(), rank = comm.rank();
  if (is_lossy(a, algo))
    fill_gradient(buf.in, b.in_count(count, p), a.dtype, rank);
  else
    b.fill_input(buf.in, b.in_count(count, p), a.dtype, a.op, rank, p, a.root);
  if (!a.in_place) std::memset(buf.out, 0xA5, out_bytes);
  Row row;
  row.wire = wire_of_run(comm, [&] { run_row(comm, b, a, algo, buf, count); });
  if (!is_lossy(a, algo)) b.fill_expected(expected, count, a.dtype, a.op, rank, p, a.root);
  const std::size_t es = dtype_size(a.dtype), n = out_bytes / es;
  const void* result = a.in_place ? buf.in : buf.out;
  const bool has_result = !(b.rooted && b.reduces && rank != a.root);  // reduce: root only
  Accuracy acc;
  if (has_result && is_lossy(a, algo)) {
    acc = b.accuracy(algo, result, n, a.dtype, a.op, p);
  } else if (has_result) {
    for (std::size_t i = 0; i < n; ++i)
      acc.wrong +=
          std::memcmp(static_cast<const char*>(result) + i * es, static_cast<char*>(expected) + i * es, es) != 0;
    for (std::size_t i = 0; a.z_columns && i < n; ++i) {
      const double e = load_value(expected, i, a.dtype);
      acc.max_abs = std::fmax(acc.max_abs, std::fabs(load_value(result, i, a.dtype) - e));
      acc.max_ref = std::fmax(acc.max_ref, std::fabs(e));
    }
  }
  double errs[2] = {acc.max_abs, acc.max_ref}, max_errs[2];
  MPI_Allreduce(&acc.wrong, &row.wrong, 1, MPI_LONG_LONG, MPI_SUM, comm.comm());
  MPI_Allreduce(errs, max_errs, 2, MPI_DOUBLE, MPI_MAX, comm.comm());
  row.max_abs = max_errs[0];
  row.max_ref = max_errs[1];
  return row;
}

// The link telemetry of the whole run, gathered (collective) and written by rank 0 as JSON:
// {"nodes": [node of rank r], "rows": [[int64 ...] per rank]}.
void write_link_stats(MpiCommunicator& comm, const std::string& path) {
  const std::vector<std::int64_t> rows = gather_link_stats(comm, false);
  if (comm.rank() != 0) return;
  std::ofstream out(path);
  const std::size_t len = link_stats_row_length(comm.size());
  out << "{\"nodes\": [";
  for (int r = 0; r < comm.size(); ++r) out << (r ? ", " : "") << comm.node_of(r);
  out << "],\n \"rows\": [";
  for (int r = 0; r < comm.size(); ++r) {
    out << (r ? ",\n  [" : "[");
    for (std::size_t k = 0; k < len; ++k) out << (k ? ", " : "") << rows[r * len + k];
    out << "]";
  }
  out << "]}\n";
  if (!out) throw std::runtime_error("cannot write " + path);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

// Times every algorithm of one row. Iterations are interleaved (iteration i of every
// algorithm, in shuffled order, then i+1), so a noisy spell on a shared machine hits all
// algorithms alike and the ratios stay meaningful. Each sample is the slowest rank's time;
// rows report medians.
// Lossy variants (-z) run on their own input buffer, `lossy_in` (gradient-like values).
std::vector<Row> measure_row(MpiCommunicator& comm, const CollectiveBench& b, const Args& a,
                             const std::vector<std::string>& algos, Buffers exact_buf, void* lossy_in,
                             std::size_t count, void* expected, std::size_t out_bytes) {
  const int p = comm.size(), rank = comm.rank();
  const std::size_t n_algos = algos.size();
  std::vector<Buffers> bufs(n_algos, exact_buf);
  for (std::size_t k = 0; k < n_algos; ++k)
    if (is_lossy(a, algos[k])) bufs[k].in = lossy_in;
  std::vector<Row> rows(n_algos);
  if (a.check)
    for (std::size_t k = 0; k < n_algos; ++k)
      rows[k] = check_once(comm, b, a, algos[k], bufs[k], count, expected, out_bytes);
  if (!kSimulated) {
    b.fill_input(exact_buf.in, b.in_count(count, p), a.dtype, a.op, rank, p, a.root);
    if (!a.lossy.empty()) fill_gradient(lossy_in, b.in_count(count, p), a.dtype, rank);
  }
  auto run_once = [&](std::size_t k) { run_row(comm, b, a, algos[k], bufs[k], count); };
  if (!a.check && a.z_columns)
    for (std::size_t k = 0; k < n_algos; ++k) rows[k].wire = wire_of_run(comm, [&] { run_once(k); });
  for (std::size_t k = 0; k < n_algos; ++k)
    for (int i = 0; i < a.warmup; ++i) run_once(k);
  std::vector<std::vector<double>> times(n_algos);
  const double start = now();
  for (int i = 0; i < a.iters; ++i) {
    // Shuffle the order too (the same seed on every rank): whoever runs right after another
    // algorithm finds the caches in that algorithm's state, so nobody may always follow the same one.
    // The seed takes the size as well: with the iteration alone every row and every run repeated
    // the same 50 orders, so one algorithm's luck in them (near the cache sizes) repeated too.
    std::vector<std::size_t> order(n_algos);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::seed_seq seed{static_cast<unsigned>(i), static_cast<unsigned>(count), static_cast<unsigned>(count >> 32)};
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    for (const std::size_t k : order) {
      barrier(comm);  // zcoll's barrier: it yields when oversubscribed, MPI_Barrier may spin
      const double t0 = now();
      run_once(k);
      times[k].push_back(now() - t0);
    }
    // Everyone stops together when rank 0 has spent its time budget on this row.
    int stop = rank == 0 && now() - start > a.max_seconds;
    broadcast(comm, &stop, 1, DType::kInt32);
    if (stop) break;
  }
  for (std::size_t k = 0; k < n_algos; ++k) {
    std::vector<double> slowest(times[k].size());
    MPI_Allreduce(times[k].data(), slowest.data(), static_cast<int>(slowest.size()), MPI_DOUBLE, MPI_MAX,
                  comm.comm());
    rows[k].time_us = 1e6 * median(slowest);
    rows[k].iters = static_cast<int>(slowest.size());
  }
  return rows;
}

std::string mpi_library() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, len);
  const auto nl = s.find('\n');
  return s.substr(0, nl);
}

int run(int argc, char** argv, const CollectiveBench& b) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Args a;
  try {
    if (!parse_args(argc, argv, b, a)) {
      if (rank == 0) print_help(b, argv[0]);
      return 0;
    }
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 2;
  }
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int p = comm.size();
  if (b.available)
    a.algorithms.erase(std::remove_if(a.algorithms.begin(), a.algorithms.end(),
                                      [&](const std::string& name) {
                                        return std::count(a.from_all.begin(), a.from_all.end(), name) &&
                                               !b.available(comm, name);
                                      }),
                       a.algorithms.end());
  if (b.rooted && (a.root < 0 || a.root >= p)) {
    if (rank == 0) std::fprintf(stderr, "%s: root %d out of range for %d ranks\n", argv[0], a.root, p);
    return 2;
  }
  const std::size_t es = dtype_size(a.dtype);
  const std::size_t max_count = b.round_count(std::max<std::size_t>(a.max_bytes / es, 1), p);
  AlignedBuffer in(b.in_count(max_count, p) * es, "zcoll-bench-in"), out(b.out_count(max_count, p) * es, "zcoll-bench-out"),
      expected(b.out_count(max_count, p) * es, "zcoll-bench-expected"),
      lossy_in(a.lossy.empty() ? 0 : b.in_count(max_count, p) * es, "zcoll-bench-lossy");

  std::FILE* csv = nullptr;
  if (rank == 0) {
    std::printf("# zcoll_%s_perf: %d ranks, %s, dtype %s%s%s, %s, iters %d, warmup %d, wait %s, simd %s\n",
                b.name, p, mpi_library().c_str(), dtype_name(a.dtype), b.reduces ? ", op " : "",
                b.reduces ? op_name(a.op) : "", a.in_place ? "in-place" : "out-of-place", a.iters, a.warmup,
                comm.wait_policy() == WaitPolicy::kYield ? "yield" : "spin",
                kernels::simd_level_name(kernels::simd_level()));
    std::printf("# %12s %11s %9s %6s %18s %11s %10s %10s %7s %7s %8s%s\n", "size", "count", "type", "redop",
                "algorithm", "time(us)", "algbw", "busbw", "#wrong", "iters", "vs_mpi",
                a.z_columns ? "        wire    ratio     maxerr     relerr" : "");
    std::fflush(stdout);
    if (!a.csv.empty()) {
      csv = std::fopen(a.csv.c_str(), "w");
      if (csv)
        std::fprintf(csv, "collective,ranks,size,count,type,redop,algorithm,time_us,algbw_gbs,busbw_gbs,wrong,iters,"
                          "vs_mpi,wire_bytes,ratio,max_abs_err,rel_err\n");
    }
  }
  long long total_wrong = 0;
  std::map<std::string, double> busbw_sum;
  int rows = 0;
  for (double bytes = static_cast<double>(a.min_bytes); bytes <= static_cast<double>(a.max_bytes) * 1.0000001;
       bytes *= a.factor) {
    const std::size_t count = b.round_count(std::max<std::size_t>(static_cast<std::size_t>(bytes) / es, 1), p);
    const std::size_t size = count * es;
    Buffers buf{in.ptr, out.ptr};
    const std::size_t out_bytes = b.out_count(count, p) * es;
    // a.algorithms ends with "mpi", the reference of the vs_mpi column.
    const std::vector<Row> measured =
        measure_row(comm, b, a, a.algorithms, buf, lossy_in.ptr, count, expected.ptr, out_bytes);
    const Row mpi = measured.back();
    std::vector<std::pair<std::string, Row>> results;
    for (std::size_t k = 0; k < measured.size(); ++k) results.emplace_back(a.algorithms[k], measured[k]);
    ++rows;
    for (const auto& [algo, row] : results) {
      total_wrong += row.wrong;
      const double algbw = size / (row.time_us * 1e-6) / 1e9;
      const double busbw = algbw * b.bus_factor(p);
      busbw_sum[algo] += busbw;
      if (rank != 0) continue;
      const char* redop = b.reduces ? op_name(a.op) : "none";
      // ratio: bytes an uncompressed bandwidth-optimal algorithm sends per rank (busbw factor x S)
      const double ratio = row.wire > 0 ? b.bus_factor(p) * size / row.wire : 0.0;
      const double rel = row.max_ref > 0 ? row.max_abs / row.max_ref : 0.0;
      std::printf("  %12zu %11zu %9s %6s %18s %11.1f %10.3f %10.3f %7lld %7d %7.2fx", size, count,
                  dtype_name(a.dtype), redop, algo.c_str(), row.time_us, algbw, busbw, row.wrong, row.iters,
                  mpi.time_us / row.time_us);
      if (a.z_columns && row.wire > 0)
        std::printf(" %11.0f %7.2fx %10.3g %10.3g", row.wire, ratio, row.max_abs, rel);
      else if (a.z_columns)
        std::printf(" %11s %8s %10.3g %10.3g", "-", "-", row.max_abs, rel);
      std::printf("\n");
      if (csv)
        std::fprintf(csv, "%s,%d,%zu,%zu,%s,%s,%s,%.3f,%.6f,%.6f,%lld,%d,%.4f,%.0f,%.4f,%.6g,%.6g\n", b.name, p, size,
                     count, dtype_name(a.dtype), redop, algo.c_str(), row.time_us, algbw, busbw, row.wrong, row.iters,
                     mpi.time_us / row.time_us, row.wire, ratio, row.max_abs, rel);
    }
    if (rank == 0) std::fflush(stdout);
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    for (const auto& algo : a.algorithms)
      std::printf("# Avg bus bandwidth %-18s: %.3f GB/s\n", algo.c_str(), busbw_sum[algo] / std::max(rows, 1));
    if (csv) std::fclose(csv);
  }
  if (!a.link_stats.empty()) write_link_stats(comm, a.link_stats);
  comm.free();  // collective, before MPI_Finalize (the destructor never calls MPI)
  return total_wrong ? 1 : 0;
}

}  // namespace

double input_value(std::size_t i, int rank, ReduceOp op) {
  if (op == ReduceOp::kProd) {
    static const double kPow2[4] = {-2, -1, 1, 2};
    return kPow2[(i * 5 + static_cast<std::size_t>(rank) * 3) % 4];
  }
  return static_cast<double>((i * 13 + static_cast<std::size_t>(rank) * 7) % 17) - 8.0;
}

double load_value(const void* buf, std::size_t i, DType dtype) {
  return dispatch_dtype(dtype, [&](auto tag) -> double {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>)
      return to_float(static_cast<const T*>(buf)[i]);
    else
      return static_cast<double>(static_cast<const T*>(buf)[i]);
  });
}

double gradient_value(std::size_t i, int rank) {
  std::uint64_t z = i * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(rank + 1) * 0xd1b54a32d192ed03ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const double u1 = std::ldexp(static_cast<double>(z >> 40), -24);
  const double u2 = std::ldexp(static_cast<double>((z >> 16) & 0xffffff), -24);
  return (u1 + u2 - 1.0) * static_cast<double>(1 + (i >> 12) % 8);
}

double stored_gradient_value(std::size_t i, int rank, DType dtype) {
  alignas(8) unsigned char v[8];
  store_value(v, 0, gradient_value(i, rank), dtype);
  return load_value(v, 0, dtype);
}

void fill_gradient(void* in, std::size_t n, DType dtype, int rank) {
  for (std::size_t i = 0; i < n; ++i) store_value(in, i, gradient_value(i, rank), dtype);
}

void store_value(void* buf, std::size_t i, double v, DType dtype) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>)
      static_cast<T*>(buf)[i] = from_float<T>(static_cast<float>(v));
    else if constexpr (std::is_unsigned_v<T>)
      static_cast<T*>(buf)[i] = static_cast<T>(static_cast<long long>(v));  // wraps like numpy
    else
      static_cast<T*>(buf)[i] = static_cast<T>(v);
  });
}

void reduce_expected(void* dst, std::size_t dst_index, std::size_t src_index, DType dtype, ReduceOp op, int p) {
  const std::size_t es = dtype_size(dtype);
  alignas(8) unsigned char acc[8], next[8];
  store_value(acc, 0, input_value(src_index, 0, op), dtype);
  for (int r = 1; r < p; ++r) {
    store_value(next, 0, input_value(src_index, r, op), dtype);
    kernels::reduce(acc, acc, next, 1, dtype, op, kernels::KernelImpl::kScalar);
  }
  if (op == ReduceOp::kAvg) kernels::divide(acc, 1, dtype, p, kernels::KernelImpl::kScalar);
  std::memcpy(static_cast<unsigned char*>(dst) + dst_index * es, acc, es);
}

int run_benchmark(int argc, char** argv, const CollectiveBench& bench) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int status = 0;
  try {
    status = run(argc, argv, bench);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", argv[0], e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
  return status;
}

}  // namespace zcoll::bench
