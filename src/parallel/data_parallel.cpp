#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/device.h"
#include "ops/elementwise.h"

namespace zt::parallel {

int64_t zero_pad_multiple(int64_t zero_stage, int64_t dp) { return zero_stage >= 1 ? 16 * dp : 1; }

DataParallel::DataParallel(std::vector<nn::ParamSet*> sets, comm::ProcessGroup& group,
                           const DataParallelOptions& options, SetGroups own)
    : sets_(std::move(sets)), group_(&group), own_(std::move(own)), opt_(options), started_(sets_.size(), false) {
  ZT_CHECK(opt_.zero_stage >= 0 && opt_.zero_stage <= 3, "parallel.zero_stage = ", opt_.zero_stage,
           " does not exist (0, 1, 2 or 3)");
  ZT_CHECK(opt_.bucket_bytes >= 4, "the gradient bucket must hold at least one element");
  const int64_t dp = group.size();
  const int64_t sg = opt_.shard_group == 0 ? dp : opt_.shard_group;
  ZT_CHECK(sg >= 1 && dp % sg == 0, "parallel.shard_group = ", opt_.shard_group, " must divide dp = ", dp,
           " (ZeRO shards span groups of that many ranks)");
  shard_group_ = group_;
  bool any_own = false;
  for (size_t i = 0; i < sets_.size(); ++i) any_own = any_own || has_own_group(i);
  ZT_CHECK(sg == dp || !any_own, "parallel.shard_group = ", opt_.shard_group,
           " (hybrid sharding) does not combine with expert parallelism yet; set parallel.shard_group = 0");
  if (sg != dp) {
    // Both splits are collectives over the dp group, made by every rank.
    own_shard_group_ = group.split(int(group.rank() / sg), int(group.rank() % sg), "dp_shard");
    replica_group_ = group.split(int(group.rank() % sg), int(group.rank() / sg), "dp_replica");
    shard_group_ = own_shard_group_.get();
    replica_behind_scatter_ = shard_group_->shares_one_queue() && replica_group_->shares_one_queue();
  }
  last_.resize(groups().size());
  if (opt_.zero_stage >= 1)
    for (size_t i = 0; i < sets_.size(); ++i) {
      nn::ParamSet* s = sets_[i];
      const int64_t p = shard_group(i).size();
      ZT_ASSERT(s->numel() % p == 0, "layer buffers must be padded to a multiple of the shard group for ZeRO");
      grad_shards_.push_back(
          Tensor::empty(Shape{s->numel() / p}, DType::f32, s->flat().device(), MemCategory::grads));
      if (opt_.zero_stage >= 2) s->release_grads();  // back only while the layer is in backward
      if (opt_.zero_stage >= 3) {
        // This rank's slice of the (initialised) weights is all it keeps.
        const int64_t len = s->numel() / p;
        Tensor shard = Tensor::empty(Shape{len}, s->dtype(), s->device(), MemCategory::params);
        ops::copy(shard, s->flat().flat_view(shard_group(i).rank() * len, Shape{len}));
        param_shards_.push_back(shard);
        s->release_params();
      }
    }
  gathers_.resize(sets_.size());
}

void DataParallel::start_gather(size_t i) {
  nn::ParamSet& s = *sets_[i];
  s.ensure_param_storage();
  if (shard_group(i).size() == 1)
    ops::copy(s.flat(), param_shards_[i]);
  else
    gathers_[i] = shard_group(i).all_gather(s.flat(), param_shards_[i]);
}

void DataParallel::params_needed(size_t i) {
  if (opt_.zero_stage < 3) return;
  if (gathers_[i]) {  // prefetched
    gathers_[i]->wait();
    gathers_[i] = nullptr;
  } else if (!sets_[i]->has_params()) {
    start_gather(i);
    if (gathers_[i]) gathers_[i]->wait();
    gathers_[i] = nullptr;
  }
  // The next layer of this pass (the embeddings are not read in backward).
  // Only while the pass moves on in its direction: the tied embedding read
  // again at the LM head must not prefetch block 0 for nothing.
  const int64_t at = int64_t(i), next = at + prefetch_;
  const bool onward = prefetch_ > 0 ? at >= last_needed_ : at <= last_needed_;
  if (prefetch_ != 0 && onward) last_needed_ = at;
  if (prefetch_ != 0 && onward && next >= (prefetch_ < 0 ? 1 : 0) && next < int64_t(sets_.size()) &&
      !sets_[size_t(next)]->has_params())
    start_gather(size_t(next));
}

void DataParallel::params_done(size_t i) {
  if (opt_.zero_stage < 3 || hold_ || gathers_[i]) return;
  sets_[i]->release_params();
}

void DataParallel::hold_full_params(bool hold) {
  if (opt_.zero_stage < 3) return;
  hold_ = hold;
  for (size_t i = 0; i < sets_.size(); ++i) {
    if (hold)
      params_needed(i);
    else if (!gathers_[i])
      sets_[i]->release_params();
  }
}

void DataParallel::begin_step() {
  std::fill(started_.begin(), started_.end(), false);
  if (opt_.zero_stage >= 2)
    for (Tensor& g : grad_shards_) ops::fill(g, 0.0);
}

void DataParallel::grads_needed(size_t set_index) {
  if (opt_.zero_stage >= 2) sets_[set_index]->ensure_grads();
}

std::vector<optim::OptimShard> DataParallel::optimizer_shards() const {
  std::vector<optim::OptimShard> out;
  for (size_t i = 0; i < sets_.size(); ++i) {
    const int64_t n = sets_[i]->numel();
    if (opt_.zero_stage == 0) {
      out.push_back({0, n, sets_[i]->grad_flat(), {}});
    } else {
      const int64_t len = n / shard_group(i).size(), r = shard_group(i).rank();
      out.push_back({r * len, (r + 1) * len, grad_shards_[i], opt_.zero_stage >= 3 ? param_shards_[i] : Tensor()});
    }
  }
  return out;
}

void DataParallel::begin_backward(bool last_micro_batch) {
  armed_ = last_micro_batch || opt_.zero_stage >= 2;
  // ZeRO >= 2 reduces every micro-batch; below, each set once per step
  // (a pipeline rank's chunks reach their last micro-batch at different times).
  if (opt_.zero_stage >= 2) std::fill(started_.begin(), started_.end(), false);
}

void DataParallel::grads_ready(size_t set_index) {
  if (armed_) start(set_index);
}

void DataParallel::start(size_t i) {
  if (started_[i]) return;
  started_[i] = true;
  nn::ParamSet& s = *sets_[i];
  if (!s.has_grads()) return;  // ZeRO >= 2: this layer produced no gradient in this pass
  const Tensor g = s.grad_flat();
  comm::ProcessGroup& rg = reduce_group(i);
  comm::ProcessGroup& sg = shard_group(i);
  if (opt_.zero_stage == 0) {
    if (rg.size() == 1) return;
    const int64_t chunk = std::max<int64_t>(1, opt_.bucket_bytes / 4);
    for (int64_t off = 0; off < g.numel(); off += chunk) {
      Pending p;
      p.work = rg.all_reduce(g.flat_view(off, Shape{std::min(chunk, g.numel() - off)}));
      p.set = i;
      pending_.push_back(std::move(p));
    }
    drain(0);
    return;
  }
  // ZeRO 1 reduce-scatters the step's gradient straight into the shard;
  // ZeRO >= 2 reduces every micro-batch into a part that drain() adds to the
  // shard, and lets the full buffer go (freed once the reduction is done).
  const bool accumulate = opt_.zero_stage >= 2;
  Pending p;
  p.set = i;
  Tensor out = grad_shards_[i];
  if (accumulate) {
    out = sg.size() == 1 ? g : Tensor::empty(grad_shards_[i].shape(), DType::f32, g.device(), MemCategory::grads);
    p.shard_part = out;
    p.full = g;
    s.release_grads();
  }
  if (sg.size() > 1)
    p.work = sg.reduce_scatter(out, g);
  else if (!accumulate)
    ops::copy(out, g);
  // Hybrid: the shard group's sum, summed again across the replicas - queued
  // behind the reduce-scatter (its work completes both), or by drain().
  if (replica_behind_scatter_ && !has_own_group(i))
    p.work = replica_group_->all_reduce(out);
  else if (replica_group_ && !has_own_group(i))
    p.replica_reduce = out;
  pending_.push_back(std::move(p));
  drain(0);  // also starts the replica all-reduces of finished reduce-scatters early
  // Back-pressure (ZeRO >= 2): at most one layer's reduction in flight while
  // the next layer's backward runs, so gradient memory stays at the shards
  // plus two layers however slow the network is. (NCCL: the compute stream
  // waits for the older one; the host goes on queueing the backward.)
  if (accumulate && pending_.size() > 1) drain(pending_.size() - 1);
}

void DataParallel::drain(size_t wait_first) {
  size_t done = 0;
  for (; done < pending_.size(); ++done) {
    Pending& p = pending_[done];
    bool finished = true;
    for (;;) {
      if (p.work) {
        if (done < wait_first) {
          p.work->wait();
        } else if (!p.work->test()) {
          finished = false;
          break;
        }
        p.work = nullptr;
      }
      if (!p.replica_reduce.defined()) break;
      p.work = replica_group_->all_reduce(p.replica_reduce);
      p.replica_reduce = Tensor();
    }
    if (!finished) break;  // keep the order: later ones wait for this one
    if (p.shard_part.defined()) ops::add(grad_shards_[p.set], grad_shards_[p.set], p.shard_part);
  }
  pending_.erase(pending_.begin(), pending_.begin() + long(done));
}

void DataParallel::finish_reduction() {
  // Sets not reduced yet (a pipeline's tied embedding, synchronised first)
  // are reduced now, in order: the step's gradients are complete.
  if (armed_ || opt_.zero_stage <= 1)
    for (size_t i = 0; i < sets_.size(); ++i) start(i);
  drain(pending_.size());
  armed_ = false;
}

double DataParallel::grad_norm(const optim::AdamW& opt, const std::vector<comm::ProcessGroup*>& model_parallel) {
  // The sets with a group of their own (expert parallelism's experts) apart.
  std::vector<bool> own(sets_.size()), rest(sets_.size());
  size_t first_own = sets_.size();
  for (size_t i = 0; i < sets_.size(); ++i) {
    own[i] = has_own_group(i);
    rest[i] = !own[i];
    if (own[i] && first_own == sets_.size()) first_own = i;
  }
  const bool any_own = first_own < sets_.size();
  double local = optim::grad_norm(opt, rest);  // ZeRO 0: the whole reduced gradient
  // ZeRO-0 replicas each take the norm of their own copy: they vote on its
  // finiteness, so a non-finite copy anywhere skips the step everywhere
  // (the norm is a sum over the other groups: those ranks agree already).
  if (opt_.zero_stage == 0 && size() > 1 && comm::sum_exact(*group_, std::isfinite(local) ? 0.0 : 1.0) > 0.0)
    local = NAN;
  // The experts' squares: over their shards' group, then over the ranks
  // holding the other experts.
  double expert_squares = 0.0;
  if (any_own) {
    const double experts = optim::grad_norm(opt, own);
    expert_squares = experts * experts;
    if (opt_.zero_stage > 0 && shard_group(first_own).size() > 1)
      expert_squares = comm::sum_exact(shard_group(first_own), expert_squares);
    if (own_.norm_group && own_.norm_group->size() > 1) expert_squares = comm::sum_exact(*own_.norm_group, expert_squares);
  }
  const bool shards = opt_.zero_stage > 0 && shard_size() > 1;
  std::vector<comm::ProcessGroup*> others;
  for (comm::ProcessGroup* g : model_parallel)
    if (g && g->size() > 1) others.push_back(g);
  if (!shards && others.empty() && !any_own) return local;
  double squares = local * local;
  // Replicas hold the same shards: sum the squares over one shard group only.
  if (shards) squares = comm::sum_exact(*shard_group_, squares);
  squares += expert_squares;
  for (comm::ProcessGroup* g : others) squares = comm::sum_exact(*g, squares);
  return std::sqrt(squares);
}

bool DataParallel::writes_checkpoint_part(size_t set) const {
  if (has_own_group(set)) return opt_.zero_stage > 0 || own_.groups[set]->rank() == 0;
  if (opt_.zero_stage == 0) return rank() == 0;
  return !replica_group_ || replica_group_->rank() == 0;
}

void DataParallel::gather_params(const optim::AdamW& opt) {
  // ZeRO-3 updated its shards in place; the layers are gathered when used.
  if (opt_.zero_stage == 0 || opt_.zero_stage >= 3) return;
  std::vector<comm::WorkHandle> work;
  for (size_t i = 0; i < sets_.size(); ++i) {
    if (shard_group(i).size() == 1) continue;
    const optim::OptimShard& sh = opt.shard(i);
    const Tensor& flat = sets_[i]->flat();
    // In place: this rank's updated slice is its own block of the layer.
    work.push_back(shard_group(i).all_gather(flat, flat.flat_view(sh.begin, Shape{sh.end - sh.begin})));
  }
  for (auto& w : work) w->wait();
}

double DataParallel::sum(double v) { return comm::sum_exact(*group_, v); }

double DataParallel::max(double v) { return comm::max_over(*group_, v); }

MemStats DataParallel::highest_peak(const MemStats& mine, int64_t* rank) {
  *rank = 0;
  if (size() == 1) return mine;
  // Every rank's peaks, total first, then by category.
  const int64_t k = 1 + kNumMemCategories;
  Tensor local = Tensor::empty(Shape{k}, DType::i64, Device::cpu(), MemCategory::comm);
  Tensor all = Tensor::empty(Shape{k * size()}, DType::i64, Device::cpu(), MemCategory::comm);
  local.data<int64_t>()[0] = mine.total_peak_bytes;
  for (int c = 0; c < kNumMemCategories; ++c) local.data<int64_t>()[1 + c] = mine.peak_bytes[size_t(c)];
  group_->all_gather(all, local)->wait();
  const int64_t* a = all.data<int64_t>();
  for (int64_t r = 1; r < size(); ++r)
    if (a[r * k] > a[*rank * k]) *rank = r;
  MemStats out = mine;
  out.total_peak_bytes = a[*rank * k];
  for (int c = 0; c < kNumMemCategories; ++c) out.peak_bytes[size_t(c)] = a[*rank * k + 1 + c];
  return out;
}

std::vector<comm::ProcessGroup*> DataParallel::groups() const {
  std::vector<comm::ProcessGroup*> g{group_};
  if (own_shard_group_) g.push_back(own_shard_group_.get());
  if (replica_group_) g.push_back(replica_group_.get());
  for (comm::ProcessGroup* o : own_.groups)
    if (o && std::find(g.begin(), g.end(), o) == g.end()) g.push_back(o);
  return g;
}

DataParallel::StepComm DataParallel::take_step_comm() {
  StepComm out;
  const auto gs = groups();
  for (size_t i = 0; i < gs.size(); ++i) {
    const comm::CommStats& s = gs[i]->stats();
    out.bytes += s.bytes_sent - last_[i].bytes_sent;
    out.busy_seconds += s.busy_seconds - last_[i].busy_seconds;
    out.wait_seconds += s.wait_seconds - last_[i].wait_seconds;
    last_[i] = s;
  }
  return out;
}

}  // namespace zt::parallel
