// The tree phases as engine schedules (pipeline.h). Both run nseg + 1 units: unit j receives
// segment j and sends segment j - 1, which unit j - 1 finished, so a rank forwards one segment
// while the next one is on its way to it.
#include "collectives/tree.h"

#include <cstring>

#include "collectives/pipeline.h"
#include "kernels/reduce.h"

namespace zcoll::detail {

BinaryTree make_tree(int rank, int p, int root) {
  BinaryTree t;
  const int v = mod(rank - root, p);
  auto real = [&](int vr) { return mod(vr + root, p); };
  if (v > 0) t.parent = real((v - 1) / 2);
  for (int c = 2 * v + 1; c <= 2 * v + 2 && c < p; ++c) t.children[t.num_children++] = real(c);
  return t;
}

namespace {

class TreeSegments : public ScheduleBase {
 public:
  TreeSegments(const BinaryTree& tree, std::size_t count, DType dtype, const PipelineOptions& o)
      : tree_(tree), count_(count), es_(dtype_size(dtype)), nseg_(num_segments(count, es_, o)) {}
  std::size_t num_units() const { return nseg_ + 1; }
  std::size_t max_recv_bytes() const { return ((count_ + nseg_ - 1) / nseg_) * es_; }

 protected:
  Range segment(std::size_t j) const { return split(Range{0, count_}, nseg_, j); }
  std::size_t bytes(std::size_t j) const { return segment(j).count * es_; }
  std::size_t offset(std::size_t j) const { return segment(j).begin * es_; }

  const BinaryTree& tree_;
  std::size_t count_, es_, nseg_;
};

// Unit j: segment j from each child into a slot; segment j - 1's partial result to the parent.
class TreeReduce : public TreeSegments {
 public:
  TreeReduce(const BinaryTree& tree, const void* in, void* acc, std::size_t count, DType dtype, ReduceOp op,
             int p, const PipelineOptions& o)
      : TreeSegments(tree, count, dtype, o), in_(static_cast<const unsigned char*>(in)),
        acc_(static_cast<unsigned char*>(acc)), dtype_(dtype), op_(op), p_(p) {}

  Unit unit(std::size_t j) const {
    Unit u;
    if (j < nseg_)
      for (int c = 0; c < tree_.num_children; ++c) u.recv[c] = {nullptr, bytes(j), tree_.children[c]};
    if (j > 0 && tree_.parent >= 0) u.send[0] = {result(j - 1), bytes(j - 1), tree_.parent};
    return u;
  }

  // acc = OP(OP(in, child0), child1), in that order on every rank.
  void on_received(std::size_t j, const Slots& slots) {
    if (j == nseg_ || bytes(j) == 0) return;
    const Range seg = segment(j);
    const unsigned char* partial = in_ + offset(j);
    for (int c = 0; c < tree_.num_children; ++c) {
      kernels::reduce(acc_ + offset(j), partial, slots.data[c], seg.count, dtype_, op_);
      partial = acc_ + offset(j);
    }
    if (tree_.parent >= 0) return;
    if (partial != acc_ + offset(j)) std::memcpy(acc_ + offset(j), partial, bytes(j));
    if (op_ == ReduceOp::kAvg) kernels::divide(acc_ + offset(j), seg.count, dtype_, p_);
  }

 private:
  // Leaves send their input as it is; interior ranks what they accumulated.
  const unsigned char* result(std::size_t j) const {
    return (tree_.num_children ? acc_ : in_) + offset(j);
  }

  const unsigned char* in_;
  unsigned char* acc_;
  DType dtype_;
  ReduceOp op_;
  int p_;
};

// Unit j: segment j from the parent straight into place; segment j - 1 to each child.
class TreeBroadcast : public TreeSegments {
 public:
  TreeBroadcast(const BinaryTree& tree, void* buf, std::size_t count, DType dtype, const PipelineOptions& o)
      : TreeSegments(tree, count, dtype, o), buf_(static_cast<unsigned char*>(buf)) {}

  std::size_t max_recv_bytes() const { return 0; }
  Unit unit(std::size_t j) const {
    Unit u;
    if (j < nseg_ && tree_.parent >= 0) u.recv[0] = {buf_ + offset(j), bytes(j), tree_.parent};
    if (j > 0)
      for (int c = 0; c < tree_.num_children; ++c) u.send[c] = {buf_ + offset(j - 1), bytes(j - 1), tree_.children[c]};
    return u;
  }

 private:
  unsigned char* buf_;
};

}  // namespace

void tree_reduce_phase(Communicator& comm, const BinaryTree& tree, const void* in, void* acc,
                       std::size_t count, DType dtype, ReduceOp op, const PipelineOptions& pipeline) {
  TreeReduce schedule(tree, in, acc, count, dtype, op, comm.size(), pipeline);
  run_pipeline(comm, schedule, pipeline, kTagTreeReduce);
}

void tree_broadcast_phase(Communicator& comm, const BinaryTree& tree, void* buf, std::size_t count,
                          DType dtype, const PipelineOptions& pipeline) {
  TreeBroadcast schedule(tree, buf, count, dtype, pipeline);
  run_pipeline(comm, schedule, pipeline, kTagTreeBroadcast);
}

}  // namespace zcoll::detail
