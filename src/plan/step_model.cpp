#include "plan/step_model.h"

#include <algorithm>

#include "core/allocator.h"
#include "core/error.h"
#include "nn/tensor_parallel.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stages.h"
#include "train/memory_plan.h"

namespace zt::plan {

namespace {

// The ring volume a reduce-scatter or all-gather of `bytes` sends per rank
// over a group of p (process_group.h): bytes (p-1)/p.
double ring(double bytes, int64_t p) { return p > 1 ? bytes * double(p - 1) / double(p) : 0.0; }

// What one rank's chunks hold: blocks, and whether the embedding and the head.
struct StageShape {
  int64_t layers = 0;
  bool embedding = false, head = false;
};
StageShape stage_shape(const train::Config& cfg, const train::PlanPlace& at) {
  StageShape st;
  for (const nn::ModelPart& part : train::rank_parts(cfg, at)) {
    const int64_t last = part.last_layer < 0 ? cfg.model.n_layer : part.last_layer;
    st.layers += last - part.first_layer;
    st.embedding = st.embedding || part.embedding;
    st.head = st.head || part.head;
  }
  return st;
}

}  // namespace

double balanced_ep_rows(int64_t ep) { return ep > 1 ? 2.0 * double(ep - 1) / double(ep) : 0.0; }

StepVolumes step_volumes(const train::Config& cfg, const parallel::MeshShape& mesh, int64_t pp_rank, double ep_rows) {
  const nn::ModelConfig& m = cfg.model;
  StepVolumes v;
  const train::PlanPlace at{mesh.dp * mesh.cp, mesh.tp, mesh.pp, 0, pp_rank};  // ZeRO shards over dp x cp
  const StageShape st = stage_shape(cfg, at);
  const double L = double(st.layers), C = double(m.d_model);
  const double s = double(dtype_size(cfg.compute_dtype()));  // activation and weight bytes per element
  const nn::TpShares sh = nn::tp_shares(m, mesh.tp, 0, mesh.ep, 0);  // this rank's heads
  const double accum = double(cfg.grad_accum_steps(mesh.dp));
  const double N = double(cfg.train.micro_batch * cfg.train.seq_len / mesh.cp);  // a rank's tokens per micro-batch
  const nn::Recompute recompute = cfg.recompute();
  const double forwards = recompute == nn::Recompute::none ? 1 : 2;  // attention's (cp) forward passes

  // Data parallelism over dp x cp (the experts' sets over the ranks holding
  // the same ones): ZeRO-0 all-reduces the f32 gradients (2 rings); ZeRO-1
  // reduce-scatters them and all-gathers the updated weights in the compute
  // type; ZeRO-2 reduce-scatters every micro-batch; ZeRO-3 also gathers the
  // weights in every micro-batch's forward (a tied embedding again at the
  // head) and backward (all but the embedding's, which backward does not
  // read). Then the scalars: the loss, the norm (or ZeRO-0's vote on it),
  // the memory report and an MoE model's aux loss, busiest expert and
  // dropped share.
  const train::RankParams params = train::rank_params(cfg, at);
  const int64_t zero = cfg.parallel.zero_stage;
  const int64_t P = mesh.dp * mesh.cp, Pe = P / std::max<int64_t>(1, mesh.ep);
  const double grads = ring(4.0 * double(params.dense), P) + ring(4.0 * double(params.experts), Pe);
  const double weights = ring(s * double(params.dense), P) + ring(s * double(params.experts), Pe);
  const double reductions = zero == 0 ? 2.0 : zero == 1 ? 1.0 : accum;  // gradient rings
  if (zero == 1 || zero == 2) v.dp_gather_bytes = weights;  // after the optimizer, not overlapped
  const double emb = double(params.embedding) * (params.head_reads_embedding ? 0.0 : 1.0);
  const double zero3 = ring(s * (2.0 * double(params.dense) - emb), P) + ring(s * 2.0 * double(params.experts), Pe);
  v.dp_bytes = reductions * grads + v.dp_gather_bytes + (zero == 3 ? accum * zero3 : 0.0);
  const double gathers = zero == 0 ? 0.0 : zero <= 2 ? 1.0 : 2.0 * accum;  // passes over the sets
  if (P > 1) v.dp_bytes += 8.0 * double(P - 1) * double(3 + kNumMemCategories + (m.moe() ? 3 : 0));
  if (zero >= 1 && params.experts > 0) v.dp_bytes += 8.0 * double(Pe - 1);  // the experts' shards' norm
  v.dp_ops = (reductions + gathers) * double(params.dense_sets + params.expert_sets) + 3;

  // Tensor parallelism (r = (tp-1)/tp): the residual stream's all-reduces -
  // each block's two outputs in forward and its two inputs' gradients in
  // backward, the embedding's output, the head's input gradient -, 2 r N C
  // each (under sequence parallelism a reduce-scatter and an all-gather of
  // the same volume, plus the two norm outputs gathered again in backward
  // and the norm weights' f32 gradients all-reduced); the loss's row max and
  // (sum, target logit) at the head, f32; full recomputation runs the
  // forward's again. A mixture-of-experts block's MLP reduces and gathers
  // as a dense one (its partial output, its input gradient) and all-reduces
  // its combine weights' f32 gradient (N k); under selective recompute with
  // SP and no ep it gathers ln2 once more to rebuild the experts' input rows.
  // Per step the norm's squares.
  if (mesh.tp > 1) {
    const double r = double(mesh.tp - 1) / double(mesh.tp);
    const double stream = N * C * (4 * L + (st.embedding ? 1 : 0) + (st.head ? 1 : 0));
    const bool sp = cfg.parallel.sequence_parallel;
    double per_micro = s * 2 * r * stream + (st.head ? 4.0 * 2 * r * 3 * N : 0.0);
    if (recompute == nn::Recompute::full) per_micro += s * 2 * r * 2 * L * N * C;
    // Key/value heads replicated over tp ranks (fewer than tp): their f32
    // weight gradients all-reduced over the replicas every micro-batch.
    if (sh.kv_replicas > 1) {
      const double kv_weights = 2.0 * double(sh.kv_heads * m.head_dim()) * C * (m.has_bias() ? 1.0 + 1.0 / C : 1.0);
      per_micro += 2.0 * 4.0 * kv_weights * L * double(sh.kv_replicas - 1) / double(sh.kv_replicas);
    }
    if (sp) {
      const double norms = (m.has_bias() ? 4 : 2) * C * L + (st.head ? (m.has_bias() ? 2 : 1) * C : 0);
      per_micro += s * r * 2 * L * N * C + 4.0 * 2 * r * norms;
    }
    double moe_ops = 0;
    if (m.moe()) {
      per_micro += 4.0 * 2 * r * N * double(m.expert_top_k) * L;
      moe_ops += L;
      if (sp && recompute == nn::Recompute::selective && mesh.ep == 1) {
        per_micro += s * r * N * C * L;
        moe_ops += L;
      }
    }
    v.tp_bytes = accum * per_micro + 8.0 * double(mesh.tp - 1);
    v.tp_ops = accum * (4 * L + 4 + (recompute == nn::Recompute::full ? 2 * L : 0) + moe_ops) + 1;
  }

  // Context parallelism: per block, the ring passes this rank's k and v on
  // cp - 1 times in every forward (recomputation runs attention's forward
  // again) and in backward, and the f32 dk, dv cp times (they travel home);
  // an MoE block's balance counts (2E + 2 doubles) are gathered.
  if (mesh.cp > 1) {
    const double kv = double(cfg.train.micro_batch * (cfg.train.seq_len / mesh.cp) * sh.kv_heads * m.head_dim());
    const double p = double(mesh.cp);
    double per_block = s * 2 * kv * (forwards * (p - 1) + (p - 1)) + 4.0 * 2 * kv * p;
    if (m.moe()) per_block += 8.0 * double(2 * m.n_expert + 2) * (p - 1);
    v.cp_bytes = accum * L * per_block;
    v.cp_ops = accum * L * 2 * (forwards + 2) * (p - 1);
  }

  // Expert parallelism: per MoE block and forward pass the per-expert slot
  // counts gathered (E doubles from each rank) and ep_rows N k rows of C
  // sent; backward sends the same rows (the outputs' gradients out, the
  // inputs' back); full recomputation runs the forward twice. Per step the
  // experts' norm squares.
  if (mesh.ep > 1 && m.moe()) {
    const double rows = (ep_rows < 0 ? balanced_ep_rows(mesh.ep) : ep_rows) * N * double(m.expert_top_k);
    const double fwd = recompute == nn::Recompute::full ? 2 : 1;
    const double p = double(mesh.ep);
    const double per_block = fwd * (8.0 * double(m.n_expert) * (p - 1) + rows * C * s) + rows * C * s;
    v.ep_bytes = accum * L * per_block + 8.0 * (p - 1);
    v.ep_ops = accum * L * (3 * fwd + 2) + 1;
  }

  // Pipeline: each micro-batch's activations to the next stage and their
  // gradients back (one boundary per chunk; the last stage sends only back).
  if (mesh.pp > 1) {
    const double chunks = double(cfg.parallel.virtual_stages);
    v.pp_bytes = accum * chunks * 2 * N * C * s;
    v.pp_ops = accum * chunks * 2;
  }
  return v;
}

StepEstimate estimate_step(const train::Config& cfg, const parallel::MeshShape& mesh, const Cluster& cluster) {
  const int64_t world = mesh.world();
  ZT_CHECK(world <= cluster.devices(), "the layout ", mesh.str(), " needs ", world, " devices; the cluster has ",
           cluster.devices());
  const nn::ModelConfig& m = cfg.model;
  const int64_t T = cfg.train.seq_len;
  const double tokens = double(cfg.train.global_batch * T);
  StepEstimate e;
  e.mesh = mesh;

  // Compute: the model's FLOPs split evenly over the ranks; recomputation
  // adds attention's forward (selective) or the blocks' whole forward (full).
  const double attention_fwd = 4.0 * double(m.n_layer) * double(m.d_model) * double(T);  // per token
  const double blocks_fwd = 2.0 * double(m.matmul_params() - m.vocab_size * m.d_model) + attention_fwd;
  const nn::Recompute rc = cfg.recompute();
  const double extra = rc == nn::Recompute::full ? blocks_fwd : rc == nn::Recompute::selective ? attention_fwd : 0.0;
  const double model_flops = m.train_flops_per_token(T);
  e.flops = (model_flops + extra) * tokens / double(world);
  double stage_balance = 1.0;  // the other ranks' work over the busiest's (1: balanced)
  if (mesh.pp > 1) {
    // A pipeline runs at its busiest rank: its stages' costs (the stage
    // planner's, which balances them: the LM head is a large share for
    // small models) on its replica's tokens, split over tp x cp.
    const int64_t v = cfg.parallel.virtual_stages;
    const auto stages = parallel::plan_pipeline_stages(m, T, mesh.pp * v, parallel::parse_stage_layers(cfg.parallel.pp_layers));
    double busiest = 0, sum = 0;
    for (int64_t r = 0; r < mesh.pp; ++r) {
      double cost = 0;
      for (int64_t c = 0; c < v; ++c) {
        const parallel::StageLayers& st = stages[size_t(c * mesh.pp + r)];
        cost += st.cost + extra * double(st.last - st.first) / double(m.n_layer);
      }
      busiest = std::max(busiest, cost);
      sum += cost;
    }
    e.flops = busiest * tokens / double(mesh.dp * mesh.tp * mesh.cp);
    // The fill and drain are one micro-batch through the other ranks: the
    // schedule's bubble (for balanced stages, (p-1) of the busiest's passes)
    // shrinks with the others' share of the work.
    stage_balance = (sum - busiest) / (double(mesh.pp - 1) * busiest);
  }
  const double rate = cluster.matmul_flops * cluster.step_efficiency;
  e.compute_seconds = e.flops / rate;
  const double accum = double(cfg.grad_accum_steps(mesh.dp));
  if (mesh.pp > 1) {
    const double b = parallel::theoretical_bubble(parallel::parse_pipeline_schedule(cfg.parallel.pp_schedule),
                                                  {mesh.pp, int64_t(accum), cfg.parallel.virtual_stages});
    e.bubble_seconds = e.compute_seconds * b * stage_balance;
  }

  // A group's link: inside a node when its members are (ranks are laid out
  // tp fastest, then cp, dp, pp: mesh.h), else between nodes.
  const auto link = [&](int64_t span) {
    return span <= cluster.devices_per_node ? cluster.intra_node_bandwidth : cluster.inter_node_bandwidth;
  };
  const auto comm_time = [&](double bytes, double ops, int64_t span) {
    return bytes > 0 ? bytes / link(span) + ops * cluster.latency_seconds : 0.0;
  };
  // The stage with the most traffic sets the step (stages differ by the embedding and the head).
  double worst = -1;
  for (int64_t r = 0; r < mesh.pp; ++r) {
    const StepVolumes v = step_volumes(cfg, mesh, r);
    const double total = v.dp_bytes + v.tp_bytes + v.cp_bytes + v.ep_bytes + v.pp_bytes;
    if (total > worst) worst = total, e.volumes = v;
  }
  const StepVolumes& v = e.volumes;
  const double backward = e.compute_seconds * 2.0 / 3.0;
  // Data parallelism: the gradients' reductions run behind the backward that
  // produces them - the last micro-batch's (ZeRO-0/1: they reduce once), every
  // micro-batch's (ZeRO-2), the whole step with ZeRO-3's gathers (prefetched) -
  // but the last layer's reduction comes after it; ZeRO-1/2's gather of the
  // updated weights follows the optimizer.
  {
    const int64_t zero = cfg.parallel.zero_stage;
    const double all = comm_time(v.dp_bytes, v.dp_ops, mesh.tp * mesh.cp * mesh.dp);
    const double gathers = v.dp_bytes > 0 ? all * v.dp_gather_bytes / v.dp_bytes : 0.0;
    const double window = zero <= 1 ? backward / accum : zero == 2 ? backward : e.compute_seconds;
    const double reduce = all - gathers;
    const double last = v.dp_ops > 0 ? reduce / v.dp_ops : 0.0;
    e.dp = {all, std::max(0.0, reduce - window) + last + gathers};
  }
  // Tensor parallelism and the experts' all-to-alls block the step.
  e.tp.seconds = e.tp.exposed_seconds = comm_time(v.tp_bytes, v.tp_ops, mesh.tp);
  e.ep.seconds = e.ep.exposed_seconds = comm_time(v.ep_bytes, v.ep_ops, mesh.tp * mesh.cp * mesh.ep);
  // The ring's transfers run behind attention.
  {
    const double attention = e.compute_seconds * 3.0 * attention_fwd / (model_flops + extra);  // forward + backward
    e.cp.seconds = comm_time(v.cp_bytes, v.cp_ops, mesh.tp * mesh.cp);
    e.cp.exposed_seconds = std::max(0.0, e.cp.seconds - attention);
  }
  // The pipeline's transfers overlap the stages' work but for its fill and drain.
  if (mesh.pp > 1) {
    e.pp.seconds = comm_time(v.pp_bytes, v.pp_ops, world);
    e.pp.exposed_seconds = e.pp.seconds / std::max(1.0, v.pp_ops) * 2.0 * double(mesh.pp - 1);
  }
  // AdamW reads the f32 master (or the f32 weights), the gradient, m and v
  // and writes them back with the weights in the compute type: per element
  // 4 x 4 + 3 x 4 (+ the compute-type copy in mixed precision).
  {
    // ZeRO >= 1 shards the dense sets over dp x cp, the experts' over the
    // ranks holding the same ones.
    const train::RankParams p = train::rank_params(cfg, {mesh.dp * mesh.cp, mesh.tp, mesh.pp, 0, 0});
    const bool sharded = cfg.parallel.zero_stage >= 1;
    const double P = double(mesh.dp * mesh.cp), Pe = P / double(std::max<int64_t>(1, mesh.ep));
    const double elements = sharded ? double(p.dense) / P + double(p.experts) / Pe : double(p.dense + p.experts);
    // Offloaded, the passes run at the host's bandwidth, always with a
    // master apart from the weights (so with their copy written), after each
    // element's f32 gradient came down the host link and before its weight
    // goes up (the trainer's copies wait).
    const bool mixed = cfg.compute_dtype() != DType::f32, offload = cfg.optim.offload;
    const double weight_bytes = double(dtype_size(cfg.compute_dtype()));
    const double passes = elements * (28.0 + (mixed || offload ? weight_bytes : 0.0));
    e.optimizer_seconds = offload ? passes / cluster.host_memory_bandwidth +
                                        elements * (4.0 + weight_bytes) / cluster.host_link_bandwidth
                                  : passes / cluster.memory_bandwidth;
  }
  // Offloaded activations: every micro-batch's kept tensors down the host
  // link in forward and up in backward, the copies waited for (exposed).
  {
    double bytes = 0;
    for (int64_t r = 0; r < mesh.pp; ++r) {  // the busiest stage's (a cp rank's rows: seq_len / cp)
      const train::PlanView view = train::context_parallel_view(cfg, {mesh.dp, mesh.tp, mesh.pp, 0, r});
      bytes = std::max(bytes, double(train::offloaded_activation_bytes(view.cfg, view.layout)));
    }
    e.offload_bytes = 2.0 * accum * bytes;
    e.offload_seconds = e.offload_bytes > 0 ? e.offload_bytes / cluster.host_link_bandwidth : 0.0;
  }
  e.step_seconds = e.compute_seconds + e.bubble_seconds + e.dp.exposed_seconds + e.tp.exposed_seconds +
                   e.cp.exposed_seconds + e.ep.exposed_seconds + e.pp.exposed_seconds + e.optimizer_seconds +
                   e.offload_seconds;
  e.tokens_per_second = tokens / e.step_seconds;
  e.mfu = model_flops * e.tokens_per_second / (cluster.peak_flops * double(world));
  return e;
}

}  // namespace zt::plan
