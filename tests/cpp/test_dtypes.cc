// bool, complex32 / complex64 / complex128 and the bitwise ops (band, bor, bxor on integers and
// bool) through every collective on 1..4 thread-ranks: every allreduce algorithm the in-process
// transport has (ring, tree, recursive and halving doubling, shm, hierarchical, ordered ring,
// auto), reduce_scatter, reduce (every root), allgather and broadcast (every root), counts 0, 1,
// primes and counts not divisible by p, default and tiny segments, in place and out of place;
// the kernel tables bit for bit; every combination without meaning refused naming dtype and op.
//
// References, written here from the definitions (not from the library's lane mapping):
//   bool      one byte 0 or 1: sum, max, bor = any rank true; prod, min, band = every rank
//             true; bxor = an odd number true
//   bitwise   integers: any bit patterns, folded with & | ^ in rank order (order-free)
//   complex   real and imaginary parts as the real type's exact inputs (tests/cpp/reference.h:
//             small integers times a shared power of two, so any order gives the same bits);
//             sum and avg componentwise through ref::reduce_reference on the parts
// Every rank must end with the same bits; copying collectives move any bit pattern.
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/compression.h"
#include "collectives/options.h"
#include "kernels/reduce.h"
#include "kernels/simd_level.h"
#include "reference.h"
#include "ztest.h"

using zcoll::Algorithm;
using zcoll::Communicator;
using zcoll::DType;
using zcoll::ReduceOp;

namespace {

constexpr int kMaxRanks = 4;
constexpr unsigned char kGuardByte = 0x5A;
constexpr std::size_t kGuard = 32;

const DType kNewTypes[] = {DType::kBool, DType::kComplex32, DType::kComplex64, DType::kComplex128};
const DType kIntegers[] = {DType::kInt8, DType::kUInt8, DType::kInt32, DType::kInt64};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kAvg, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};

bool complex_type(DType d) {
  return d == DType::kComplex32 || d == DType::kComplex64 || d == DType::kComplex128;
}

DType real_of(DType d) {
  return d == DType::kComplex32   ? DType::kFloat16
         : d == DType::kComplex64 ? DType::kFloat32
                                  : DType::kFloat64;
}

// The ops each type takes (what torch's gloo takes: tests/torch_mpi/dtype_walk.py).
std::vector<ReduceOp> valid_ops(DType d) {
  if (complex_type(d)) return {ReduceOp::kSum, ReduceOp::kAvg};
  if (d == DType::kBool)
    return {ReduceOp::kSum,  ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
            ReduceOp::kBand, ReduceOp::kBor,  ReduceOp::kBxor};
  if (ref::is_float(d))
    return {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};
  return {ReduceOp::kSum,  ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
          ReduceOp::kBand, ReduceOp::kBor,  ReduceOp::kBxor};
}

bool is_valid(DType d, ReduceOp op) {
  for (ReduceOp v : valid_ops(d))
    if (v == op) return true;
  return false;
}

// Rank r's input: bool 0/1 (every 5th index true everywhere, every 7th false everywhere, else a
// coin per rank), complex as exact parts, integers as any bits; `bits`: any bit pattern.
ref::Buffer input(DType d, ReduceOp op, std::size_t n, int r, int p, bool bits) {
  const auto salt = static_cast<std::uint64_t>(d) * 16 + static_cast<std::uint64_t>(op);
  ref::Buffer x(d, n);
  if (bits || (!complex_type(d) && d != DType::kBool)) {
    for (std::size_t i = 0; i < n * x.elem_size(); ++i)
      x.bytes[i] = static_cast<unsigned char>(ref::hash(static_cast<std::uint64_t>(r), i, n, salt + 7));
    return x;
  }
  if (d == DType::kBool) {
    for (std::size_t i = 0; i < n; ++i)
      x.bytes[i] = i % 5 == 0 ? 1 : i % 7 == 0 ? 0 : ref::hash(static_cast<std::uint64_t>(r), i, n, salt) & 1;
    return x;
  }
  const ref::Buffer parts = ref::make_input(ref::Inputs::kExact, real_of(d), op, 2 * n, r, p);
  x.bytes = parts.bytes;
  return x;
}

// OP over every rank's input in rank order, from the definitions above.
ref::Buffer reference(const std::vector<ref::Buffer>& in, ReduceOp op) {
  const DType d = in[0].dtype;
  const std::size_t n = in[0].count;
  ref::Buffer out(d, n);
  if (complex_type(d)) {
    std::vector<ref::Buffer> parts;
    for (const ref::Buffer& x : in) {
      ref::Buffer part(real_of(d), 2 * n);
      part.bytes = x.bytes;
      parts.push_back(part);
    }
    out.bytes = ref::reduce_reference(parts, op).bytes;
    return out;
  }
  if (d != DType::kBool) return ref::reduce_reference(in, op);
  for (std::size_t i = 0; i < n; ++i) {
    int ones = 0;
    for (const ref::Buffer& x : in) ones += x.bytes[i] != 0;
    const bool any = ones > 0, all = ones == static_cast<int>(in.size());
    bool v = false;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
        v = any;
        break;
      case ReduceOp::kProd:
      case ReduceOp::kMin:
      case ReduceOp::kBand:
        v = all;
        break;
      case ReduceOp::kBxor:
        v = ones % 2 == 1;
        break;
      case ReduceOp::kAvg:
        break;
    }
    out.bytes[i] = v ? 1 : 0;
  }
  return out;
}

// "" when equal, else how many elements differ and the first one's bytes (ref::compare_bits reads
// at most 8-byte elements).
std::string differences(const ref::Buffer& got, const ref::Buffer& want) {
  if (got.bytes.size() != want.bytes.size())
    return ztest::str("got ", got.count, " elements, expected ", want.count);
  const std::size_t es = zcoll::dtype_size(want.dtype);
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < want.count; ++i)
    if (std::memcmp(got.bytes.data() + i * es, want.bytes.data() + i * es, es) != 0 && !bad++) first = i;
  if (!bad) return "";
  std::string s = ztest::str(bad, " of ", want.count, " elements differ; at ", first, ": got");
  for (std::size_t k = 0; k < es; ++k) s += ztest::str(" ", int(got.bytes[first * es + k]));
  s += ", expected";
  for (std::size_t k = 0; k < es; ++k) s += ztest::str(" ", int(want.bytes[first * es + k]));
  return s;
}

enum class Coll { kAllreduce, kReduceScatter, kReduce, kAllgather, kBroadcast };

struct Case {
  Coll coll = Coll::kAllreduce;
  Algorithm algorithm = Algorithm::kAuto;
  DType dtype = DType::kBool;
  ReduceOp op = ReduceOp::kSum;
  std::size_t count = 0;
  int root = 0;
  bool in_place = false;
  bool bits = false;  // any bit patterns: only "the same on every rank" is checked for reductions
  zcoll::PipelineOptions pipeline;

  std::string name() const {
    const char* colls[] = {"allreduce", "reduce_scatter", "reduce", "allgather", "broadcast"};
    return ztest::str(colls[static_cast<int>(coll)], " ",
                      coll == Coll::kAllreduce ? zcoll::algorithm_name(algorithm) : "", " ",
                      zcoll::dtype_name(dtype), " ", zcoll::op_name(op), " count=", count, " root=", root,
                      in_place ? " in-place" : "", " segment=", pipeline.max_segment_bytes,
                      " depth=", pipeline.depth, bits ? " bits" : "");
  }
};

struct Got {
  bool done = false, guards = true;
  ref::Buffer out;
};

// Runs c on this rank: output inside guard bytes pre-filled with a per-rank pattern.
Got execute(Communicator& comm, const Case& c) {
  const int p = comm.size(), me = comm.rank();
  const std::size_t es = zcoll::dtype_size(c.dtype);
  const ref::Buffer in = input(c.dtype, c.op, c.count, me, p, c.bits);
  std::size_t out_count = c.count;
  if (c.coll == Coll::kReduceScatter) out_count = ref::block_count(c.count, p, me);
  if (c.coll == Coll::kAllgather) out_count = c.count * static_cast<std::size_t>(p);
  std::vector<unsigned char> raw(out_count * es + 2 * kGuard, kGuardByte);
  unsigned char* out = raw.data() + kGuard;
  std::memset(out, 0xC3 ^ me, out_count * es);
  Got g;
  const bool has_out = c.coll != Coll::kReduce || me == c.root;
  switch (c.coll) {
    case Coll::kAllreduce: {
      zcoll::AllreduceOptions o;
      o.op = c.op;
      o.algorithm = c.algorithm;
      o.pipeline = c.pipeline;
      if (c.in_place) std::memcpy(out, in.data(), in.bytes.size());
      zcoll::allreduce(comm, c.in_place ? out : in.data(), out, c.count, c.dtype, o);
      break;
    }
    case Coll::kReduceScatter: {
      zcoll::ReduceOptions o;
      o.op = c.op;
      o.pipeline = c.pipeline;
      zcoll::reduce_scatter(comm, in.data(), out, c.count, c.dtype, o);
      break;
    }
    case Coll::kReduce: {
      zcoll::ReduceOptions o;
      o.op = c.op;
      o.root = c.root;
      o.pipeline = c.pipeline;
      if (has_out && c.in_place) std::memcpy(out, in.data(), in.bytes.size());
      zcoll::reduce(comm, has_out && c.in_place ? out : in.data(), has_out ? out : nullptr, c.count, c.dtype,
                    o);
      break;
    }
    case Coll::kAllgather: {
      zcoll::CollectiveOptions o;
      o.pipeline = c.pipeline;
      unsigned char* mine = out + static_cast<std::size_t>(me) * c.count * es;
      if (c.in_place) std::memcpy(mine, in.data(), in.bytes.size());
      zcoll::allgather(comm, c.in_place ? mine : in.data(), out, c.count, c.dtype, o);
      break;
    }
    case Coll::kBroadcast: {
      zcoll::CollectiveOptions o;
      o.root = c.root;
      o.pipeline = c.pipeline;
      if (me == c.root) std::memcpy(out, in.data(), in.bytes.size());
      zcoll::broadcast(comm, out, c.count, c.dtype, o);
      break;
    }
  }
  for (std::size_t i = 0; i < kGuard; ++i)
    g.guards = g.guards && raw[i] == kGuardByte && raw[kGuard + out_count * es + i] == kGuardByte;
  g.out = ref::Buffer(c.dtype, out_count);
  std::memcpy(g.out.data(), out, out_count * es);
  g.done = true;
  return g;
}

void verify(const Case& c, int p, const std::vector<Got>& got) {
  ztest::Context ctx(ztest::str(c.name(), " p=", p));
  std::vector<ref::Buffer> in;
  for (int r = 0; r < p; ++r) in.push_back(input(c.dtype, c.op, c.count, r, p, c.bits));
  ref::Buffer want;
  if (c.coll == Coll::kBroadcast) {
    want = in[static_cast<std::size_t>(c.root)];
  } else if (c.coll == Coll::kAllgather) {
    want = ref::Buffer(c.dtype, c.count * static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r)
      std::memcpy(want.bytes.data() + static_cast<std::size_t>(r) * in[0].bytes.size(), in[r].data(),
                  in[r].bytes.size());
  } else {
    want = reference(in, c.op);
  }
  const std::size_t es = zcoll::dtype_size(c.dtype);
  const int first = c.coll == Coll::kReduce ? c.root : 0;
  for (int r = 0; r < p; ++r) {
    if (c.coll == Coll::kReduce && r != c.root) continue;
    ztest::Context rank_ctx(ztest::str("rank ", r));
    const Got& g = got[static_cast<std::size_t>(r)];
    CHECK(g.guards);
    ref::Buffer expected = want;
    if (c.coll == Coll::kReduceScatter) {
      expected = ref::Buffer(c.dtype, ref::block_count(c.count, p, r));
      std::memcpy(expected.data(), want.bytes.data() + ref::block_begin(c.count, p, r) * es,
                  expected.bytes.size());
    }
    const bool reduces = c.coll != Coll::kAllgather && c.coll != Coll::kBroadcast;
    if (!(c.bits && reduces)) CHECK_EQ(differences(g.out, expected), "");  // bits: no one right answer
    if (c.coll != Coll::kReduceScatter && r != first)
      CHECK_EQ(differences(g.out, got[static_cast<std::size_t>(first)].out), "");
  }
}

void run(int p, const std::vector<Case>& list, const zcoll::InProcOptions& options) {
  std::vector<std::vector<Got>> got(list.size(), std::vector<Got>(static_cast<std::size_t>(p)));
  ON_RANKS(p, options, [&](Communicator& comm) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      try {
        got[i][static_cast<std::size_t>(comm.rank())] = execute(comm, list[i]);
      } catch (const std::exception& e) {
        throw std::runtime_error(ztest::str(list[i].name(), ": ", e.what()));
      }
    }
  });
  for (std::size_t i = 0; i < list.size(); ++i) {
    bool all = true;
    for (const Got& g : got[i]) all = all && g.done;
    if (all) verify(list[i], p, got[i]);
  }
}

std::vector<std::size_t> counts(int p) {
  const auto n = static_cast<std::size_t>(p);
  return {0, 1, 2, 7, 31, 97, n + 1, 2 * n - 1, 24 * n + 1, 1009};
}

zcoll::PipelineOptions pipe(std::size_t segment, int depth) {
  zcoll::PipelineOptions o;
  o.max_segment_bytes = segment;
  o.depth = depth;
  return o;
}

// Every (dtype, op) of the new types and the bitwise ops on integers, every count; every third
// case with 64-byte segments, every third with 200-byte ones (not a multiple of complex128's 16).
std::vector<Case> reducing(Coll coll, Algorithm algorithm, int p, int root) {
  std::vector<Case> v;
  int k = 0;
  auto add = [&](DType d, ReduceOp op, std::size_t count, bool bits) {
    Case c;
    c.coll = coll;
    c.algorithm = algorithm;
    c.dtype = d;
    c.op = op;
    c.count = count;
    c.root = (root + k) % p;
    c.in_place = coll != Coll::kReduceScatter && k % 2 == 1;
    c.bits = bits;
    if (k % 3 == 1) c.pipeline = pipe(64, 1);
    if (k % 3 == 2) c.pipeline = pipe(200, 3);
    ++k;
    v.push_back(c);
  };
  for (DType d : kNewTypes)
    for (ReduceOp op : valid_ops(d))
      for (std::size_t n : counts(p)) add(d, op, n, false);
  for (DType d : kIntegers)
    for (ReduceOp op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor})
      for (std::size_t n : counts(p)) add(d, op, n, false);
  // Any bit patterns (NaNs, -0, infinities in the complex parts; bytes other than 0/1 are not
  // bools and are not made): the same bits on every rank.
  for (DType d : {DType::kComplex32, DType::kComplex64, DType::kComplex128})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) add(d, op, 97, true);
  return v;
}

std::vector<Case> copying(Coll coll, int p) {
  std::vector<Case> v;
  int k = 0;
  for (DType d : kNewTypes)
    for (std::size_t n : counts(p))
      for (int root = 0; root < (coll == Coll::kBroadcast ? p : 1); ++root) {
        Case c;
        c.coll = coll;
        c.dtype = d;
        c.count = n;
        c.root = root;
        c.bits = d != DType::kBool;
        c.in_place = k % 2 == 1;
        if (k % 3 == 1) c.pipeline = pipe(64, 2);
        ++k;
        v.push_back(c);
      }
  return v;
}

// The options each allreduce algorithm needs: hierarchical two nodes (unequal at 3 ranks, so the
// extras fold), ordered_ring measured links.
zcoll::InProcOptions options_for(Algorithm a, int p) {
  zcoll::InProcOptions o = ztest::test_options();
  if (a == Algorithm::kHierarchical)
    for (int r = 0; r < p; ++r) o.nodes.push_back(r < (p + 1) / 2 ? 0 : 1);
  if (a == Algorithm::kOrderedRing) {
    o.bandwidth.assign(static_cast<std::size_t>(p) * p, 0.0);
    for (int i = 0; i < p; ++i)
      for (int j = 0; j < p; ++j)
        if (i != j)
          o.bandwidth[static_cast<std::size_t>(i) * p + j] = 1e9 * (0.3 + ref::uniform(i, j, p, 11));
  }
  return o;
}

void allreduce_every_size(Algorithm a) {
  for (int p = 1; p <= kMaxRanks; ++p) run(p, reducing(Coll::kAllreduce, a, p, 0), options_for(a, p));
}

}  // namespace

TEST(dtypes, allreduce_ring) { allreduce_every_size(Algorithm::kRing); }
TEST(dtypes, allreduce_tree) { allreduce_every_size(Algorithm::kTree); }
TEST(dtypes, allreduce_recursive_doubling) { allreduce_every_size(Algorithm::kRecursiveDoubling); }
TEST(dtypes, allreduce_halving_doubling) { allreduce_every_size(Algorithm::kHalvingDoubling); }
TEST(dtypes, allreduce_shm) { allreduce_every_size(Algorithm::kShm); }
TEST(dtypes, allreduce_hierarchical) { allreduce_every_size(Algorithm::kHierarchical); }
TEST(dtypes, allreduce_ordered_ring) { allreduce_every_size(Algorithm::kOrderedRing); }
TEST(dtypes, allreduce_auto) { allreduce_every_size(Algorithm::kAuto); }

TEST(dtypes, reduce_scatter) {
  for (int p = 1; p <= kMaxRanks; ++p)
    run(p, reducing(Coll::kReduceScatter, Algorithm::kAuto, p, 0), ztest::test_options());
}

TEST(dtypes, reduce_every_root) {
  for (int p = 1; p <= kMaxRanks; ++p)
    for (int root = 0; root < p; ++root)
      run(p, reducing(Coll::kReduce, Algorithm::kAuto, p, root), ztest::test_options());
}

TEST(dtypes, allgather) {
  for (int p = 1; p <= kMaxRanks; ++p) run(p, copying(Coll::kAllgather, p), ztest::test_options());
}

TEST(dtypes, broadcast_every_root) {
  for (int p = 1; p <= kMaxRanks; ++p) run(p, copying(Coll::kBroadcast, p), ztest::test_options());
}

// Every combination without meaning: std::invalid_argument naming the dtype and the op, from
// every reducing entry point, before any message (so every rank throws and the group still works).
TEST(dtypes, meaningless_ops_refused) {
  for (int p : {1, 3}) {
    ON_RANKS(p, ztest::test_options(), [&](Communicator& comm) {
      std::vector<unsigned char> x(64, 0), y(64, 0);
      for (int code = 0; code < zcoll::kNumDTypes; ++code) {
        const auto d = static_cast<DType>(code);
        for (ReduceOp op : kAllOps) {
          ztest::Context ctx(ztest::str(zcoll::dtype_name(d), " ", zcoll::op_name(op)));
          const bool valid = is_valid(d, op);
          std::string message;
          auto attempt = [&](const std::function<void()>& fn) {
            try {
              fn();
              return true;
            } catch (const std::invalid_argument& e) {
              message = e.what();
              return false;
            }
          };
          zcoll::AllreduceOptions a;
          a.op = op;
          zcoll::ReduceOptions r;
          r.op = op;
          CHECK_EQ(attempt([&] { zcoll::allreduce(comm, x.data(), y.data(), 3, d, a); }), valid);
          if (!valid) {
            CHECK(message.find(zcoll::dtype_name(d)) != std::string::npos);
            CHECK(message.find(std::string("'") + zcoll::op_name(op) + "'") != std::string::npos);
          }
          CHECK_EQ(attempt([&] { zcoll::reduce_scatter(comm, x.data(), y.data(), 3, d, r); }), valid);
          CHECK_EQ(attempt([&] { zcoll::reduce(comm, x.data(), y.data(), 3, d, r); }), valid);
          CHECK_EQ(attempt([&] { zcoll::validate_op(d, op); }), valid);
        }
      }
      // The compressed allreduce keeps refusing what is not float32 / float16 / bfloat16.
      for (DType d : kNewTypes) {
        std::string message;
        try {
          zcoll::allreduce_compressed(comm, x.data(), y.data(), 3, d, zcoll::parse_compression("fp16"));
        } catch (const std::invalid_argument& e) {
          message = e.what();
        }
        CHECK(message.find("needs float32, float16 or bfloat16") != std::string::npos);
        CHECK(message.find(zcoll::dtype_name(d)) != std::string::npos);
      }
      // Still in step after all that: a bool allreduce.
      unsigned char t = comm.rank() == 0 ? 1 : 0;
      zcoll::AllreduceOptions any;
      any.op = ReduceOp::kMax;
      zcoll::allreduce(comm, &t, &t, 1, DType::kBool, any);
      CHECK_EQ(static_cast<int>(t), 1);
    });
  }
}

// The kernels on every table this CPU runs, at lengths around every vector width and from
// misaligned addresses: bit for bit the reference (and so each other), out aliasing a or b.
TEST(dtypes, kernels_every_table) {
  const std::size_t lengths[] = {0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 1000, 1009};
  for (zcoll::kernels::KernelImpl impl : zcoll::kernels::supported_kernel_impls()) {
    for (int code = 0; code < zcoll::kNumDTypes; ++code) {
      const auto d = static_cast<DType>(code);
      const bool new_type = code >= static_cast<int>(DType::kBool);
      for (ReduceOp op : valid_ops(d)) {
        const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
        if (!new_type && !bitwise) continue;  // the numeric ops: tests/core/test_kernels.py
        for (std::size_t n : lengths) {
          for (int alias = 0; alias < 3; ++alias) {
            ztest::Context ctx(ztest::str(zcoll::kernels::kernel_impl_name(impl), " ", zcoll::dtype_name(d),
                                          " ", zcoll::op_name(op), " n=", n, " alias ", alias));
            const std::vector<ref::Buffer> in = {input(d, op, n, 0, 2, false), input(d, op, n, 1, 2, false)};
            ref::Buffer want = reference(in, ReduceOp::kAvg == op ? ReduceOp::kSum : op);
            const std::size_t bytes = in[0].bytes.size(), shift = 1 + n % 7;  // misaligned
            std::vector<unsigned char> a(bytes + shift), b(bytes + shift),
                out(bytes + shift + kGuard, kGuardByte);
            std::memcpy(a.data() + shift, in[0].data(), bytes);
            std::memcpy(b.data() + shift, in[1].data(), bytes);
            unsigned char* dst = alias == 1   ? a.data() + shift
                                 : alias == 2 ? b.data() + shift
                                              : out.data() + shift;
            zcoll::kernels::reduce(dst, a.data() + shift, b.data() + shift, n, d, op, impl);
            ref::Buffer got(d, n);
            if (bytes) std::memcpy(got.data(), dst, bytes);
            CHECK_EQ(differences(got, want), "");
            if (alias == 0) CHECK(out[shift + bytes] == kGuardByte && out[shift - 1] == kGuardByte);
          }
        }
      }
    }
    // avg's division on complex: each part divided as its real type (halves in float32, rounded once).
    for (DType d : {DType::kComplex32, DType::kComplex64, DType::kComplex128}) {
      for (std::size_t n : lengths) {
        ztest::Context ctx(
            ztest::str(zcoll::kernels::kernel_impl_name(impl), " divide ", zcoll::dtype_name(d), " n=", n));
        std::vector<ref::Buffer> sums = {input(d, ReduceOp::kSum, n, 0, 3, false),
                                         input(d, ReduceOp::kSum, n, 1, 3, false),
                                         input(d, ReduceOp::kSum, n, 2, 3, false)};
        ref::Buffer sum = reference(sums, ReduceOp::kSum), avg = reference(sums, ReduceOp::kAvg);
        zcoll::kernels::divide(sum.data(), n, d, 3, impl);
        CHECK_EQ(differences(sum, avg), "");
      }
    }
  }
}
