#include "cases.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>

#include "ztest.h"

namespace cases {
namespace {

using ref::Buffer;
using ref::Inputs;

constexpr std::size_t kGuard = 64;  // bytes before and after every output
constexpr unsigned char kGuardByte = 0x5A;

// An output area with guard bytes on both sides, pre-filled with a per-rank pattern so that an
// element nobody wrote shows up as wrong.
struct Guarded {
  std::vector<unsigned char> raw;
  std::size_t bytes;

  Guarded(std::size_t n, int rank) : raw(n + 2 * kGuard, kGuardByte), bytes(n) {
    std::fill(raw.begin() + kGuard, raw.begin() + kGuard + n, static_cast<unsigned char>(0xC3 ^ rank));
  }
  unsigned char* data() { return raw.data() + kGuard; }
  bool intact() const {
    for (std::size_t i = 0; i < kGuard; ++i)
      if (raw[i] != kGuardByte || raw[kGuard + bytes + i] != kGuardByte) return false;
    return true;
  }
  Buffer take(DType dtype, std::size_t count) const {
    Buffer b(dtype, count);
    if (count) std::memcpy(b.data(), raw.data() + kGuard, bytes);
    return b;
  }
};

struct Outcome {
  bool done = false;  // the call returned on this rank
  Buffer out;
  bool guards_intact = true;
  Algorithm algorithm = Algorithm::kAuto;  // allreduce: what ran
};

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "allreduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllgather:
      return "allgather";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReduce:
      return "reduce";
  }
  return "?";
}

bool reduces(Collective c) { return c != Collective::kAllgather && c != Collective::kBroadcast; }

Buffer input_of(const Case& c, int rank, int p) {
  return ref::make_input(c.inputs, c.dtype, c.op, c.count, rank, p);
}

Outcome execute(zcoll::Communicator& comm, const Case& c) {
  const int p = comm.size(), me = comm.rank();
  const std::size_t es = zcoll::dtype_size(c.dtype), bytes = c.count * es;
  Buffer in = input_of(c, me, p);
  Outcome o;
  switch (c.collective) {
    case Collective::kAllreduce: {
      Guarded out(bytes, me);
      if (c.in_place && bytes) std::memcpy(out.data(), in.data(), bytes);
      zcoll::AllreduceOptions opt;
      opt.op = c.op;
      opt.algorithm = c.algorithm;
      opt.pipeline = c.pipeline;
      o.algorithm =
          zcoll::allreduce(comm, c.in_place ? out.data() : in.data(), out.data(), c.count, c.dtype, opt);
      o.out = out.take(c.dtype, c.count);
      o.guards_intact = out.intact();
      break;
    }
    case Collective::kReduceScatter: {
      const std::size_t mine = ref::block_count(c.count, p, me);
      Guarded out(mine * es, me);
      zcoll::ReduceOptions opt;
      opt.op = c.op;
      opt.pipeline = c.pipeline;
      zcoll::reduce_scatter(comm, in.data(), out.data(), c.count, c.dtype, opt);
      o.out = out.take(c.dtype, mine);
      o.guards_intact = out.intact();
      break;
    }
    case Collective::kAllgather: {
      Guarded out(bytes * static_cast<std::size_t>(p), me);
      unsigned char* mine = out.data() + static_cast<std::size_t>(me) * bytes;
      if (c.in_place && bytes) std::memcpy(mine, in.data(), bytes);
      zcoll::CollectiveOptions opt;
      opt.pipeline = c.pipeline;
      zcoll::allgather(comm, c.in_place ? mine : in.data(), out.data(), c.count, c.dtype, opt);
      o.out = out.take(c.dtype, c.count * static_cast<std::size_t>(p));
      o.guards_intact = out.intact();
      break;
    }
    case Collective::kBroadcast: {
      Guarded buf(bytes, me);
      if (me == c.root && bytes) std::memcpy(buf.data(), in.data(), bytes);
      zcoll::CollectiveOptions opt;
      opt.root = c.root;
      opt.pipeline = c.pipeline;
      zcoll::broadcast(comm, buf.data(), c.count, c.dtype, opt);
      o.out = buf.take(c.dtype, c.count);
      o.guards_intact = buf.intact();
      break;
    }
    case Collective::kReduce: {
      zcoll::ReduceOptions opt;
      opt.op = c.op;
      opt.root = c.root;
      opt.pipeline = c.pipeline;
      if (me != c.root) {  // `out` is ignored off the root: pass none
        zcoll::reduce(comm, in.data(), nullptr, c.count, c.dtype, opt);
        break;
      }
      Guarded out(bytes, me);
      if (c.in_place && bytes) std::memcpy(out.data(), in.data(), bytes);
      zcoll::reduce(comm, c.in_place ? out.data() : in.data(), out.data(), c.count, c.dtype, opt);
      o.out = out.take(c.dtype, c.count);
      o.guards_intact = out.intact();
      break;
    }
  }
  o.done = true;
  return o;
}

// Random floats: |got - exact| <= (p + 1) u SUM |x| (avg: divided by p), exact in long double;
// got[i] is element offset + i of the result.
std::string check_tolerance(const Buffer& got, std::size_t offset, const std::vector<Buffer>& inputs,
                            ReduceOp op) {
  const std::size_t p = inputs.size();
  const double u = ref::unit_roundoff(got.dtype);
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < got.count; ++i) {
    long double exact = 0, magnitude = 0;
    for (const Buffer& x : inputs) {
      exact += x.get(offset + i);
      magnitude += std::fabs(x.get(offset + i));
    }
    if (op == ReduceOp::kAvg) {
      exact /= p;
      magnitude /= p;
    }
    const long double err = std::fabs(static_cast<long double>(got.get(i)) - exact);
    if (!(err <= static_cast<long double>((p + 1) * u) * magnitude)) {
      if (!bad++)
        first = ztest::str("at ", i, ": got ", ref::describe_element(got, i), ", exact ",
                           static_cast<double>(exact));
    }
  }
  return bad ? ztest::str(bad, " of ", got.count, " elements outside (p+1) u SUM|x|; ", first) : "";
}

void verify(const Case& c, int p, const std::vector<Outcome>& got) {
  ztest::Context ctx(ztest::str(c.name(), " p=", p));
  std::vector<Buffer> inputs;
  for (int r = 0; r < p; ++r) inputs.push_back(input_of(c, r, p));
  Buffer expected;
  switch (c.collective) {
    case Collective::kAllreduce:
    case Collective::kReduceScatter:
    case Collective::kReduce:
      expected = ref::reduce_reference(inputs, c.op);
      break;
    case Collective::kAllgather:
      expected = Buffer(c.dtype, c.count * static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r)
        if (c.count)
          std::memcpy(expected.bytes.data() + static_cast<std::size_t>(r) * inputs[0].bytes.size(),
                      inputs[r].data(), inputs[r].bytes.size());
      break;
    case Collective::kBroadcast:
      expected = inputs[static_cast<std::size_t>(c.root)];
      break;
  }
  const int first_with_result = c.collective == Collective::kReduce ? c.root : 0;
  for (int r = 0; r < p; ++r) {
    const Outcome& o = got[static_cast<std::size_t>(r)];
    if (c.collective == Collective::kReduce && r != c.root) continue;
    ztest::Context rank_ctx(ztest::str("rank ", r));
    CHECK(o.guards_intact);
    Buffer want = expected;
    std::size_t offset = 0;
    if (c.collective == Collective::kReduceScatter) {
      offset = ref::block_begin(c.count, p, r);
      want = Buffer(c.dtype, ref::block_count(c.count, p, r));
      if (want.count)
        std::memcpy(want.data(), expected.bytes.data() + offset * want.elem_size(), want.bytes.size());
    }
    if (c.inputs == Inputs::kRandom) {
      CHECK_EQ(check_tolerance(o.out, offset, inputs, c.op), "");
    } else if (c.inputs == Inputs::kBits && reduces(c.collective) && ref::is_float(c.dtype)) {
      // Any bit pattern: two NaNs, min(-0, +0) and rounding depend on the order, so there is no
      // one right answer; but every rank must get the same bits (checked below).
    } else {
      CHECK_EQ(ref::compare_bits(o.out, want, /*nan_equal=*/c.inputs == Inputs::kNan), "");
    }
    // Every rank ends with the same bits (NaN payloads included).
    if (c.collective != Collective::kReduceScatter && r != first_with_result)
      CHECK_EQ(ref::compare_bits(o.out, got[static_cast<std::size_t>(first_with_result)].out), "");
    if (c.collective == Collective::kAllreduce) {
      const std::string ran = zcoll::algorithm_name(o.algorithm);
      CHECK_EQ(ran, zcoll::algorithm_name(got[0].algorithm));
      if (c.algorithm == Algorithm::kAuto)
        CHECK(o.algorithm != Algorithm::kAuto && o.algorithm != Algorithm::kMpi);
      else
        CHECK_EQ(ran, zcoll::algorithm_name(c.algorithm));
    }
  }
}

std::vector<std::size_t> small_counts(int p) {
  std::set<std::size_t> s = {0, 1, 2, 7, 31, 97, static_cast<std::size_t>(p) + 1};
  return {s.begin(), s.end()};
}

// Long enough for many segments with tiny segment sizes, not divisible by most p.
std::vector<std::size_t> long_counts(int p) {
  std::set<std::size_t> s = {13, 257, 24 * static_cast<std::size_t>(p) + 1, 1009};
  if (p > 1) s.insert(static_cast<std::size_t>(p) - 1);
  return {s.begin(), s.end()};
}

zcoll::PipelineOptions pipeline(std::size_t segment_bytes, int depth) {
  zcoll::PipelineOptions o;
  o.max_segment_bytes = segment_bytes;
  o.depth = depth;
  return o;
}

// Every reducing case shape; `make` fills in the collective-specific fields.
template <typename Make>
std::vector<Case> reducing_matrix(int p, Make make) {
  std::vector<Case> v;
  int n = 0;
  auto add = [&](DType dtype, ReduceOp op, std::size_t count, zcoll::PipelineOptions pipe, Inputs inputs) {
    Case c = make();
    c.dtype = dtype;
    c.op = op;
    c.count = count;
    c.pipeline = pipe;
    c.inputs = inputs;
    c.in_place = (n++ % 2) == 1;
    v.push_back(c);
  };
  for (DType d : ref::all_dtypes())
    for (ReduceOp op : ref::ops_for(d))
      for (std::size_t count : small_counts(p)) add(d, op, count, {}, Inputs::kExact);
  // Many segments per chunk: 64-byte segments with depth 1, 200-byte ones (not a multiple of
  // every element size) with depth 3, single-element segments.
  const std::pair<DType, ReduceOp> pairs[] = {
      {DType::kFloat32, ReduceOp::kSum}, {DType::kFloat64, ReduceOp::kAvg},
      {DType::kFloat16, ReduceOp::kSum}, {DType::kBFloat16, ReduceOp::kProd},
      {DType::kInt8, ReduceOp::kSum},    {DType::kInt64, ReduceOp::kMax},
      {DType::kInt32, ReduceOp::kProd},  {DType::kUInt8, ReduceOp::kMin},
      {DType::kFloat16, ReduceOp::kAvg}, {DType::kFloat32, ReduceOp::kMin}};
  for (const auto& [d, op] : pairs) {
    for (std::size_t count : long_counts(p)) {
      add(d, op, count, pipeline(64, 1), Inputs::kExact);
      add(d, op, count, pipeline(200, 3), Inputs::kExact);
    }
    add(d, op, 2 * static_cast<std::size_t>(p) + 3, pipeline(1, 2), Inputs::kExact);
  }
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin})
      for (std::size_t count : {std::size_t{31}, std::size_t{97}}) add(d, op, count, {}, Inputs::kNan);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) add(d, op, 1009, pipeline(256, 2), Inputs::kRandom);
    // NaNs with different payloads, -0 and +0, infinities: the order every rank applies must be
    // the same one.
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kSum, ReduceOp::kProd})
      add(d, op, 97, pipeline(64, 2), Inputs::kBits);
  }
  return v;
}

}  // namespace

std::string Case::name() const {
  std::string s = collective_name(collective);
  if (collective == Collective::kAllreduce) s += ztest::str(" ", zcoll::algorithm_name(algorithm));
  s += ztest::str(" ", zcoll::dtype_name(dtype));
  if (reduces(collective)) s += ztest::str(" ", zcoll::op_name(op));
  s += ztest::str(" count=", count);
  if (collective == Collective::kBroadcast || collective == Collective::kReduce)
    s += ztest::str(" root=", root);
  s += in_place ? " in-place" : " out-of-place";
  s += ztest::str(" segment=", pipeline.max_segment_bytes, " depth=", pipeline.depth, " ",
                  ref::inputs_name(inputs));
  return s;
}

std::vector<std::size_t> counts_for(int p) {
  std::set<std::size_t> s = {0, 1, 2, 3, 7, 13, 31, 97, 1009};
  const auto n = static_cast<std::size_t>(p);
  s.insert({n - 1, n + 1, 24 * n + 1});
  return {s.begin(), s.end()};
}

std::vector<Case> allreduce_cases(Algorithm algorithm, int p) {
  return reducing_matrix(p, [&] {
    Case c;
    c.collective = Collective::kAllreduce;
    c.algorithm = algorithm;
    return c;
  });
}

std::vector<Case> reducing_cases(Collective collective, int p, int root) {
  std::vector<Case> v = reducing_matrix(p, [&] {
    Case c;
    c.collective = collective;
    c.root = root;
    return c;
  });
  if (collective == Collective::kReduceScatter)  // in-place has no meaning for it
    for (Case& c : v) c.in_place = false;
  return v;
}

std::vector<Case> copying_cases(Collective collective, int p, int root) {
  std::vector<Case> v;
  int n = 0;
  for (DType d : ref::all_dtypes()) {
    for (std::size_t count : counts_for(p)) {
      Case c;
      c.collective = collective;
      c.dtype = d;
      c.count = count;
      c.root = root;
      c.inputs = Inputs::kBits;
      c.in_place = (n++ % 2) == 1;
      if (count > 100) c.pipeline = pipeline(n % 3 ? 64 : 200, 1 + n % 3);
      v.push_back(c);
    }
  }
  return v;
}

void run_and_check(int p, const std::vector<Case>& list, const zcoll::InProcOptions& options) {
  std::vector<std::vector<Outcome>> got(list.size(), std::vector<Outcome>(static_cast<std::size_t>(p)));
  ON_RANKS(p, options, [&](zcoll::Communicator& comm) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      try {
        got[i][static_cast<std::size_t>(comm.rank())] = execute(comm, list[i]);
      } catch (const std::exception& e) {
        throw std::runtime_error(ztest::str(list[i].name(), ": ", e.what()));
      }
    }
  });
  // After a failure (reported by ON_RANKS) only the cases every rank finished are checked.
  for (std::size_t i = 0; i < list.size(); ++i) {
    const bool all_done = std::all_of(got[i].begin(), got[i].end(), [](const Outcome& o) { return o.done; });
    if (all_done) verify(list[i], p, got[i]);
  }
}

}  // namespace cases
