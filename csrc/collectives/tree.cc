#include "collectives/tree.h"

#include <cstring>
#include <deque>
#include <vector>

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

void tree_reduce_phase(Communicator& comm, const BinaryTree& tree, const void* in, void* acc,
                       std::size_t count, DType dtype, ReduceOp op, const PipelineOptions& pipeline) {
  const std::size_t es = dtype_size(dtype);
  const std::size_t nseg = num_segments(count, es, pipeline);
  const std::size_t depth = static_cast<std::size_t>(pipeline_depth(pipeline));
  const std::size_t seg_bytes = ((count + nseg - 1) / nseg) * es;
  const auto* src = static_cast<const unsigned char*>(in);
  auto* dst = static_cast<unsigned char*>(acc);
  const int nc = tree.num_children;
  auto* slots = static_cast<unsigned char*>(comm.scratch(depth * 2 * seg_bytes, /*slot=*/0));
  std::vector<Request> recvs(depth * 2);
  std::deque<Request> sends;

  auto segment = [&](std::size_t j) { return split(Range{0, count}, nseg, j); };
  auto slot = [&](std::size_t j, int c) { return slots + ((j % depth) * 2 + c) * seg_bytes; };
  auto post = [&](std::size_t j) {
    if (j >= nseg || segment(j).count == 0) return;
    for (int c = 0; c < nc; ++c)
      recvs[(j % depth) * 2 + c] = comm.irecv(slot(j, c), segment(j).count * es, tree.children[c], kTagTreeReduce);
  };

  for (std::size_t j = 0; j < depth; ++j) post(j);
  for (std::size_t j = 0; j < nseg; ++j) {
    const Range seg = segment(j);
    if (seg.count == 0) continue;
    const unsigned char* result = src + seg.begin * es;
    for (int c = 0; c < nc; ++c) {
      comm.wait(recvs[(j % depth) * 2 + c]);
      kernels::reduce(dst + seg.begin * es, result, slot(j, c), seg.count, dtype, op);
      result = dst + seg.begin * es;
    }
    post(j + depth);
    if (tree.parent >= 0) {
      sends.push_back(comm.isend(result, seg.count * es, tree.parent, kTagTreeReduce));
    } else {
      if (result != dst + seg.begin * es) std::memcpy(dst + seg.begin * es, result, seg.count * es);
      if (op == ReduceOp::kAvg) kernels::divide(dst + seg.begin * es, seg.count, dtype, comm.size());
    }
  }
  for (auto& r : sends) comm.wait(r);
}

void tree_broadcast_phase(Communicator& comm, const BinaryTree& tree, void* buf, std::size_t count,
                          DType dtype, const PipelineOptions& pipeline) {
  const std::size_t es = dtype_size(dtype);
  const std::size_t nseg = num_segments(count, es, pipeline);
  const std::size_t depth = static_cast<std::size_t>(pipeline_depth(pipeline));
  auto* data = static_cast<unsigned char*>(buf);
  std::vector<Request> recvs(depth);
  std::vector<Request> sends;
  sends.reserve(nseg * tree.num_children);

  auto segment = [&](std::size_t j) { return split(Range{0, count}, nseg, j); };
  auto post = [&](std::size_t j) {
    if (j >= nseg || tree.parent < 0 || segment(j).count == 0) return;
    const Range seg = segment(j);
    recvs[j % depth] = comm.irecv(data + seg.begin * es, seg.count * es, tree.parent, kTagTreeBroadcast);
  };

  for (std::size_t j = 0; j < depth; ++j) post(j);
  for (std::size_t j = 0; j < nseg; ++j) {
    const Range seg = segment(j);
    if (seg.count == 0) continue;
    comm.wait(recvs[j % depth]);
    post(j + depth);
    for (int c = 0; c < tree.num_children; ++c)
      sends.push_back(comm.isend(data + seg.begin * es, seg.count * es, tree.children[c], kTagTreeBroadcast));
  }
  comm.wait_all(sends);
}

}  // namespace zcoll::detail
