#include "train/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#if ZT_WITH_CUDA
#include "backend/cuda/runtime.h"
#endif
#include "comm/process_group.h"
#include "core/allocator.h"
#include "core/error.h"
#include "nn/ring_attention.h"
#include "nn/tensor_parallel.h"
#include "nn/transformer.h"
#include "ops/workspace.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stages.h"

namespace zt::train {

namespace {

int64_t padded(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

int64_t numel_of(const std::vector<nn::ParamSpec>& specs) {
  int64_t n = 0;
  for (const nn::ParamSpec& s : specs) n += s.shape.numel();
  return n;
}

// Flat buffer lengths (elements, padding included) of one chunk's parameter
// sets in the model's order: embeddings, blocks, head (with the head
// stage's copy of a tied embedding). *tied: that copy's or the tied
// embedding's set, whose gradient lives through the whole pass (-1: none).
std::vector<int64_t> chunk_sets(const Config& cfg, const nn::TpShares& sh, const nn::ModelPart& part, int64_t pad,
                                int64_t* tied, std::vector<bool>* is_experts = nullptr) {
  const nn::ModelConfig& m = cfg.model;
  std::vector<int64_t> sets;
  std::vector<bool> experts_at;
  *tied = -1;
  if (part.embedding) {
    if (m.tied_embeddings) *tied = 0;
    sets.push_back(padded(numel_of(nn::embedding_specs(m, sh)), pad));
  }
  for (int64_t l = part.first_layer; l < part.last_layer; ++l) {
    const auto [own, experts] = nn::split_expert_specs(nn::block_specs(m, sh, size_t(l)));
    sets.push_back(padded(numel_of(own), pad));
    if (!experts.empty()) {  // MoE: the experts' own set
      experts_at.resize(sets.size(), false);
      experts_at.push_back(true);
      sets.push_back(padded(numel_of(experts), pad));
    }
  }
  if (part.head) {
    int64_t n = numel_of(nn::head_specs(m, sh));
    if (m.tied_embeddings && !part.embedding) {
      n += nn::embedding_specs(m, sh).front().shape.numel();
      *tied = int64_t(sets.size());
    }
    sets.push_back(padded(n, pad));
  }
  if (is_experts) {
    experts_at.resize(sets.size(), false);
    *is_experts = experts_at;
  }
  return sets;
}

// Activation bytes of one chunk for one micro-batch: what it keeps between
// its forward and its backward, and what it holds at the peak of each pass
// (the end of the forward; the backward of its last block).
struct ChunkActivations {
  int64_t kept = 0, forward_peak = 0, backward_peak = 0;
  // zb: what a micro-batch holds between its input-gradient pass and its
  // weight pass - each linear layer's input and output gradient - and at
  // the end of the input-gradient pass (that, and the last block's work).
  int64_t held_for_weights = 0, backward_input_peak = 0;
  // zb: what a block's input-gradient pass holds beyond backward's, the
  // deferred weight work keeping gradients a backward frees as it goes.
  int64_t deferred_gradients = 0;
  // train.offload_activations: the blocks' kept tensors, on the host from
  // the forward to the backward (not in `kept`).
  int64_t host_kept = 0;
  int64_t rows = 0;  // one (R, C) tensor of the residual stream: what pipeline stages exchange
  int64_t peak() const { return std::max(forward_peak, backward_peak); }
};

// The trainer's batch on the host: (B, T) i32 tokens and targets, whole
// sequences of the cp group's. Device memory only when the device is the host.
int64_t batch_bytes(const Config& cfg, int64_t cp) {
  return parse_device(cfg.train.device).is_cpu() ? 8 * cfg.train.micro_batch * cfg.train.seq_len * cp : 0;
}

// cp: the context-parallel group whose ranks' tokens make a routing call
// (an expert capacity counts the micro-batch's: nn/moe.h).
ChunkActivations chunk_activations(const Config& cfg, const nn::TpShares& sh, const nn::ModelPart& part,
                                   bool sequence_parallel, bool pipelined, nn::Recompute policy, int64_t cp = 1) {
  const nn::ModelConfig& m = cfg.model;
  const int64_t N = cfg.train.micro_batch * cfg.train.seq_len;  // tokens of a micro-batch
  const int64_t R = sequence_parallel ? N / sh.tp : N;          // rows of the residual stream on this rank
  const int64_t s = int64_t(dtype_size(cfg.compute_dtype()));
  const int64_t C = m.d_model, D = m.head_dim(), q = sh.q_heads * D, kv = sh.kv_heads * D;
  const int64_t W = m.mlp_in_width() / sh.tp, F = sh.ff;
  const int64_t stats = m.arch == nn::Arch::gpt2 ? 2 : 1;  // f32 per row and norm: (mean,) rstd
  // What BlockActivations keeps (see nn/transformer.h): (R, C) rows of the
  // residual stream, (N, local width) matmul outputs, f32 statistics.
  const int64_t rows_c = s * R * C;
  // The MLP's bytes of a micro-batch: kept (mlp_in, act; or the experts'
  // K rows of nn/moe.h - xs, h, act, ys: K = N k dropless, at most E x the
  // capacity under one (the micro-batch's under cp: a rank whose slots come
  // first may keep all of them) - and the router state: f32 probabilities, choice
  // and weights, and the dispatch plan's two i32 per slot, which a GPU keeps
  // on the host),
  // rebuilt by selective recompute (act; or xs and act), held for deferred
  // weight gradients (act and d mlp_in; or act, dh, xs, dys and the router's
  // gradient) and in flight in backward (d act; or, beside dys, which
  // replaces the freed ys, and f32 dweight: with the weight gradients made
  // at once, one at a time - d act while act lives, dxe once act is freed,
  // then the router's f32 dlogits and its copy in the compute dtype;
  // deferred, they all stay: d act and dxe with dlogits and its copy).
  // A shared expert (width Fs here) keeps its mlp_in and act as a dense
  // SwiGLU MLP does (act rebuilt; both held for its deferred weight
  // gradients); its output gradient in flight is smaller than the experts'.
  // Expert parallelism moves the K sorted rows to the experts' owners and
  // back: a rank computes on the rows it receives, K of them where the
  // routing is balanced (every expert at its capacity: exactly; dropless, a
  // busier owner holds more) and keeps the exchange's two i32 orders per
  // received row (on the host); the rows it sent are freed, so selective
  // recompute rebuilds act alone; backward holds the received output
  // gradient's rows beside dys, and the input gradient's rows sent back.
  const int64_t E = m.n_expert, k = m.expert_top_k, Fs = sh.shared_ff;
  const bool moe = m.moe(), ep = moe && cfg.parallel.ep > 1;
  const bool host = parse_device(cfg.train.device).is_cpu();
  const int64_t cap = moe ? nn::expert_capacity(m, N * cp) : -1;
  const int64_t K = cap < 0 ? N * k : std::min(N * k, E * cap);  // the experts' rows
  const int64_t plan_bytes = host ? 8 * N * k + (ep ? 8 * K : 0) : 0;
  const int64_t mlp_kept =
      moe ? s * K * (2 * C + 3 * F) + N * (4 * E + 8 * k + s * 3 * Fs) + plan_bytes : N * s * (W + F);
  const int64_t mlp_rebuilt = moe ? s * K * ((ep ? 0 : C) + F) + N * s * Fs : N * s * F;
  const int64_t mlp_held = moe ? s * K * (2 * C + 3 * F) + N * (s * E + s * 3 * Fs) : N * s * (W + F);
  const int64_t router_gradient = N * E * (4 + (s == 4 ? 0 : s));  // dlogits, and dl unless the dtype is f32
  // The experts' gradients beside dys and f32 dweight (4kN): under ep the
  // received dye throughout (`received`); then d act, dxe, and last the
  // rows on their way back - under ep dxs with dxe's rows permuted, else
  // the router's dlogits - with each weight gradient made at once (freeing
  // act and xe as it goes) or all deferred (keeping them).
  const int64_t expert_rows = s * K * C;
  const int64_t received = ep ? expert_rows : 0;
  const int64_t way_back = ep ? std::max(2 * expert_rows, expert_rows + router_gradient) : router_gradient;
  const int64_t mlp_gradients =
      moe ? 4 * N * k + received + std::max({s * K * F, expert_rows, way_back}) : N * s * F;
  const int64_t full_block = 4 * rows_c /*x_in, ln1, res_mid, ln2*/ + s * N * (2 * q + 2 * kv) /*q, att, k, v*/ +
                             mlp_kept + 4 * (N * sh.q_heads /*lse*/ + 2 * stats * R);
  // What backward rebuilds of one block (selective: attention output, lse
  // and activation output; full: all but the block's input).
  int64_t rebuilt = 0;
  if (policy == nn::Recompute::selective) rebuilt = s * N * q + mlp_rebuilt + 4 * N * sh.q_heads;
  if (policy == nn::Recompute::full) rebuilt = full_block - rows_c;
  const int64_t layers = part.last_layer - part.first_layer;
  const int64_t block_kept = full_block - rebuilt;
  // Offloaded, the device holds one block's kept tensors at a time: the
  // block just made until they are on the host, or the one brought back for
  // its backward.
  const bool offload = cfg.train.offload_activations && layers > 0;
  const int64_t blocks = offload ? 0 : layers * block_kept;  // on the device from forward to backward
  const int64_t one_block = offload ? block_kept : 0;          // in flight while a block moves
  // The inputs (ln1 and ln2 as all N rows, att, act) and output gradients
  // (the row-parallel layers' two, all N rows; d mlp_in, dq, dk, dv) the
  // deferred weight gradients of a block read (MoE: the experts' own, in
  // mlp_held, instead of mlp_out's output gradient; a shared expert's
  // output gradient as mlp_out's).
  const int64_t held_block = s * N * ((moe && Fs == 0 ? 3 : 4) * C + 2 * q + 2 * kv) + mlp_held;
  // The step's host copy of the token ids (i32) per chunk and micro-batch:
  // device memory only when the device is the host.
  const int64_t ids = host ? 4 * N : 0;
  ChunkActivations a;
  a.rows = rows_c;
  a.host_kept = offload ? layers * block_kept : 0;
  // The gradients in flight in a block's backward, beyond what it keeps:
  // the residual stream's, one more of width C (the column-parallel
  // products' partial input gradient), under sequence parallelism also a
  // norm's output gathered to all N rows and that partial gradient's N rows
  // before their reduce-scatter; then the larger of its two halves.
  // The MLP's: one of the hidden width F (GPT-2's at the GeLU's input,
  // Llama's at the SwiGLU's output: its input gradient is written over
  // mlp_in), or the experts' above. The attention's: d att and dq, dk, dv
  // (packed: dqkv), or split, dq, dk, dv and the dqkv the RoPE pass joins
  // them into, once the MLP's act (and Llama's mlp_in) are freed.
  // Under zb's input-gradient pass the weight work's closures keep what a
  // backward frees as it goes: the MLP's act and d mlp_in (GPT-2's made
  // apart), the two row-parallel products' output gradients (copies of the
  // residual stream's, or its gathered rows: each N x C), both norms'
  // gathered rows under sequence parallelism, and a mixture's router
  // gradient and the shared expert's output gradient.
  const nn::QkvForm form = nn::qkv_form(m, sh, parse_device(cfg.train.device), cp > 1);
  const bool gelu = m.arch == nn::Arch::gpt2;
  const int64_t rest_of_gradients = 2 * rows_c + (sequence_parallel ? 2 * s * N * C : 0);
  const int64_t qkv_gradients = s * N * (q + 2 * kv);  // dq, dk, dv; or dqkv
  const int64_t attention_gradients =  // d att is freed before the split's dqkv is made
      std::max(s * N * q + qkv_gradients, form == nn::QkvForm::split ? 2 * qkv_gradients : 0);
  const int64_t dense_freed = moe ? 0 : N * s * (F + (gelu ? 0 : W));  // act, and Llama's mlp_in
  const int64_t gradients =
      rest_of_gradients + std::max(mlp_gradients, moe ? 0 : attention_gradients - dense_freed);
  const int64_t row_gradient = s * N * C;  // a row-parallel product's output gradient kept for its weight work
  const int64_t mlp_held_gradients = moe ? N * s * E + (Fs > 0 ? row_gradient : 0)  // router; shared expert's
                                         : row_gradient + (gelu ? N * s * W : 0);      // mlp_out's; GPT-2's d mlp_in
  const int64_t mlp_deferred_peak =  // MoE: the experts' all at once, or later the shared expert's d act
      moe ? std::max(4 * N * k + s * K * (C + F) + received + way_back, mlp_held_gradients + N * s * Fs)
          : row_gradient + N * s * (gelu ? W : F);
  const int64_t gradients_deferred =
      rest_of_gradients + std::max(mlp_deferred_peak, mlp_held_gradients + row_gradient /*proj's*/ +
                                                          (sequence_parallel ? row_gradient : 0) /*ln1's rows*/ +
                                                          attention_gradients);
  a.deferred_gradients = layers > 0 ? gradients_deferred - gradients : 0;
  const int64_t backward = blocks + one_block + ids + rebuilt + gradients;
  // zb's input-gradient pass ends at the first block: the later blocks'
  // held tensors, this block's activations (rebuilt whole under full
  // recompute, with the rerun forward's (R, C) output, dropped once made,
  // and the branch tensor where the residual is not added in the products)
  // and its gradients in flight.
  const int64_t rerun_temporaries = (nn::residual_in_products() ? 1 : 2) * rows_c;
  const int64_t last_block_of_held = layers > 0 ? full_block - held_block + gradients_deferred +
                                                     (policy == nn::Recompute::full ? rerun_temporaries : 0)
                                                : 0;
  if (!part.head) {
    a.kept = blocks + ids;
    // The embedding's backward is a weight pass too: it keeps every token's
    // gradient row, made once the first block's gradients in flight are gone.
    const int64_t embedding_rows = part.embedding ? s * N * C : 0;
    a.held_for_weights = layers * held_block + ids + embedding_rows;
    a.forward_peak = a.kept + rows_c + one_block;  // the output, until sent
    a.backward_peak = backward;
    a.backward_input_peak = a.held_for_weights - embedding_rows + last_block_of_held;
    return a;
  }
  const int64_t losses = 4 * N;
  const int64_t head_stats = 4 * stats * R;
  if (pipelined) {
    // The head keeps its input (all rows) and the logits' gradient between
    // forward and backward, as a block keeps its matmul inputs.
    const int64_t head_only = head_stats + s * N * C /*head_in*/ + s * N * sh.vocab_rows + losses;
    a.kept = blocks + ids + rows_c /*x_final*/ + head_only;
    a.held_for_weights = a.kept - blocks + layers * held_block;
    // Offloaded, the last block's kept tensors are on the host before the
    // head makes its own.
    a.forward_peak = std::max(a.kept + (sequence_parallel ? rows_c : 0), a.kept - head_only + one_block);
    a.backward_peak = backward + losses;
    a.backward_input_peak = a.held_for_weights + last_block_of_held;
    return a;
  }
  // Fused head: one chunk of logits at a time; the final norm's output and
  // its gradient.
  const int64_t chunk = nn::head_chunk_rows(N, sh.vocab_rows, nn::default_head_chunk_elems(parse_device(cfg.train.device)));
  const int64_t logits = s * chunk * sh.vocab_rows;
  a.kept = blocks + ids + rows_c /*x_final*/ + head_stats + s * N * C /*d_lnf*/ + losses;
  // Under sequence parallelism the final norm's output is gathered to all N
  // rows for the head, and its gradient reduce-scattered back to (R, C).
  a.forward_peak = a.kept + std::max(rows_c /*lnf rows*/ + logits + (sequence_parallel ? s * N * C + rows_c : 0),
                                      one_block /*the last block's, before the head*/);
  a.backward_peak = backward + losses;
  return a;
}

// Rank r's actions of a schedule. The planner asks for every stage and
// tensor-parallel rank of one shape in a row (largest_rank_plan), and a
// search for thousands of layouts: the last shape's schedule is kept
// rather than built again per rank (it was a third of `zettatron plan`'s time).
const std::vector<parallel::Action>& rank_actions(parallel::PipelineSchedule kind, const parallel::PipelineShape& shape,
                                                 int64_t rank) {
  thread_local struct {
    parallel::PipelineSchedule kind{};
    parallel::PipelineShape shape{0, 0, 0};
    std::vector<std::vector<parallel::Action>> schedule;
  } last;
  const auto key = [](parallel::PipelineSchedule k, const parallel::PipelineShape& s) {
    return std::make_tuple(k, s.stages, s.micro_batches, s.virtual_stages);
  };
  if (key(last.kind, last.shape) != key(kind, shape)) {
    last.schedule = parallel::build_pipeline_schedule(kind, shape);
    last.kind = kind;
    last.shape = shape;
  }
  return last.schedule[size_t(rank)];
}

}  // namespace

std::vector<nn::ModelPart> rank_parts(const Config& cfg, const PlanPlace& at) {
  if (at.pp == 1) return {nn::ModelPart{0, cfg.model.n_layer, true, true}};
  const int64_t v = cfg.parallel.virtual_stages;
  const auto plan = parallel::plan_pipeline_stages(cfg.model, cfg.train.seq_len, at.pp * v,
                                                   parallel::parse_stage_layers(cfg.parallel.pp_layers));
  std::vector<nn::ModelPart> parts;
  for (int64_t c = 0; c < v; ++c) {
    const parallel::StageLayers& st = plan[size_t(c * at.pp + at.pp_rank)];
    parts.push_back({st.first, st.last, st.embedding, st.head});
  }
  return parts;
}

int64_t host_meminfo_bytes(const std::string& name) {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == name + ":") return kib * 1024;
  return 0;
}

std::string format_gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GiB", bytes / double(int64_t(1) << 30));
  return b;
}

PlanPlace plan_layout(const Config& cfg, int64_t world) {
  const parallel::MeshShape s = parallel::resolve_mesh_shape(
      {cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.cp, cfg.parallel.ep}, world);
  return {s.dp, s.tp, s.pp, 0, 0};
}

PlanView context_parallel_view(const Config& cfg, PlanPlace layout) {
  PlanView v{cfg, layout};
  const int64_t cp = cfg.parallel.cp;
  if (cp > 1) {
    v.cfg.train.seq_len /= cp;
    v.cfg.train.global_batch *= cp;  // the same micro-batches per replica
    v.cfg.parallel.cp = 1;
    v.cfg.parallel.dp = layout.dp * cp;
    v.layout.dp *= cp;
    v.layout.cp = cp;
  }
  return v;
}

RankParams rank_params(const Config& cfg, const PlanPlace& at) {
  const nn::TpShares sh = nn::tp_shares(cfg.model, at.tp, at.tp_rank, cfg.parallel.ep, 0);
  const int64_t pad = parallel::zero_pad_multiple(cfg.parallel.zero_stage, at.dp);
  RankParams r;
  for (const nn::ModelPart& part : rank_parts(cfg, at)) {
    int64_t tied = -1;
    std::vector<bool> experts;
    const std::vector<int64_t> sets = chunk_sets(cfg, sh, part, pad, &tied, &experts);
    for (size_t i = 0; i < sets.size(); ++i) {
      (experts[i] ? r.experts : r.dense) += sets[i];
      ++(experts[i] ? r.expert_sets : r.dense_sets);
    }
    if (part.embedding) r.embedding += sets.front();
    r.head_reads_embedding = r.head_reads_embedding || (part.embedding && part.head && tied == 0);
  }
  return r;
}

MemoryPlan plan_memory(const Config& cfg) { return plan_memory(cfg, PlanPlace{}); }

MemoryPlan plan_memory(const Config& cfg, const PlanPlace& at) {
  const nn::ModelConfig& m = cfg.model;
  const int64_t s = int64_t(dtype_size(cfg.compute_dtype()));
  const int64_t zero = cfg.parallel.zero_stage;
  const int64_t shard = cfg.parallel.shard_group > 0 ? cfg.parallel.shard_group : at.dp;  // ZeRO shard group
  const int64_t pad = parallel::zero_pad_multiple(zero, at.dp);  // as the trainer pads the flat buffers
  // Expert parallelism: this rank's E / ep experts (every ep rank holds as many).
  const nn::TpShares sh = nn::tp_shares(m, at.tp, at.tp_rank, cfg.parallel.ep, 0);
  const bool sp = at.tp > 1 && cfg.parallel.sequence_parallel;
  const std::vector<nn::ModelPart> parts = rank_parts(cfg, at);
  const bool mixed = cfg.compute_dtype() != DType::f32;

  // Expert parallelism: the experts' sets shard over the ranks holding the
  // same experts (dp x cp / ep: the view's dp counts cp), the rest over the
  // shard group; hybrid sharding does not combine with it (data_parallel.h).
  ZT_CHECK(at.dp % cfg.parallel.ep == 0, "parallel.ep = ", cfg.parallel.ep, " does not divide the ", at.dp,
           " data-parallel ranks (dp x cp) of this layout: each ep group's ranks are data-parallel replicas");
  const int64_t expert_shard = cfg.parallel.ep > 1 ? at.dp / cfg.parallel.ep : shard;
  // Parameter sets of every chunk, in forward order.
  int64_t all = 0, shard_sets = 0, in_use = 0, reducing = 0, certain = 0, largest_set = 0, largest_shard = 0;
  for (const nn::ModelPart& part : parts) {
    int64_t tied = -1;
    std::vector<bool> experts;
    const std::vector<int64_t> sets = chunk_sets(cfg, sh, part, pad, &tied, &experts);
    const auto shard_of = [&](size_t i) { return experts[i] ? expert_shard : shard; };
    for (size_t i = 0; i < sets.size(); ++i) {
      all += sets[i];
      shard_sets += sets[i] / shard_of(i);  // equal slices: every set is padded to a multiple of 16 dp
      largest_set = std::max(largest_set, sets[i]);
      largest_shard = std::max(largest_shard, sets[i] / shard_of(i));
      // ZeRO-3 holds a layer's full weights while it runs (a
      // mixture-of-experts block's two sets, its own and its experts') and,
      // without a pipeline, the next set's, prefetched: the trainer turns
      // prefetching off under pipeline schedules, whose passes change
      // direction every action. The LM head also reads a tied embedding
      // held in another set of this chunk.
      int64_t run = sets[i];
      if (at.pp == 1) {
        for (size_t j = i + 1; j < std::min(sets.size(), i + (m.moe() ? 3 : 2)); ++j) run += sets[j];
      } else if (i + 1 < sets.size() && experts[i + 1]) {
        run += sets[i + 1];
      }
      in_use = std::max(in_use, run);
    }
    const bool both_ends = part.embedding && part.head;
    if (both_ends && tied >= 0) in_use = std::max(in_use, sets.back() + sets[size_t(tied)]);
    // ZeRO-2/3: full gradient buffers of the layers in backward beside the
    // shards - one being reduce-scattered with its result, and the next
    // one being produced (data_parallel.cpp's back-pressure). Worst: the
    // largest reducing while the next one is made, each with its
    // reduce-scatter result (the newer one starts before back-pressure waits
    // for the older: seen as half a mixture-of-experts block over the plan
    // at shard 2); when one chunk holds both ends, the embedding's reduction
    // overlaps the next micro-batch's LM head - the same tied buffer again.
    // A shard group of one adds each buffer to its shard at once: only the
    // layer being produced is in flight (under expert parallelism, beside
    // one of the others reducing), and a tied embedding's buffer, which
    // lives through the whole backward.
    // in_flight[i]: set i's buffer with its reduce-scatter result (none at a group of one).
    std::vector<int64_t> in_flight(sets.size());
    for (size_t i = 0; i < sets.size(); ++i) in_flight[i] = sets[i] + (shard_of(i) > 1 ? sets[i] / shard_of(i) : 0);
    // The largest two in flight: a set reducing (in a group of more than
    // one) beside the largest other set being made.
    size_t first = 0;
    for (size_t i = 1; i < sets.size(); ++i)
      if (in_flight[i] > in_flight[first]) first = i;
    int64_t second = 0;
    for (size_t i = 0; i < sets.size(); ++i)
      if (i != first) second = std::max(second, in_flight[i]);
    int64_t worst = in_flight[first];
    for (size_t i = 0; i < sets.size(); ++i)
      if (shard_of(i) > 1) worst = std::max(worst, in_flight[i] + (i == first ? second : in_flight[first]));
    if (tied >= 0 && shard == 1) worst = std::max(worst, in_flight[first] + second);  // the two largest sets
    if (tied >= 0 && both_ends && shard > 1) worst = std::max(worst, sets[size_t(tied)] + in_flight[size_t(tied)]);
    reducing = std::max(reducing, worst);
    // What no reduction timing goes below: a shard group of one reduces with
    // no communication (its buffers in flight are `reducing` exactly); a
    // larger one allocates the largest layer's reduce-scatter result while
    // its full buffer lives (data_parallel.cpp).
    certain = std::max(certain, shard == 1 && expert_shard == 1 ? worst : in_flight[first]);
  }
  MemoryPlan p;
  // RoPE's table per chunk (f32, params).
  const int64_t rope = m.arch == nn::Arch::llama3 ? 4 * m.max_seq_len * m.head_dim() * int64_t(parts.size()) : 0;
  p.weights = rope + s * (zero >= 3 ? shard_sets + in_use : all);
  // ZeRO-2/3: f32 shards plus the layers in flight; ZeRO-1 full buffers
  // plus shards; ZeRO-0 full buffers.
  p.gradients = 4 * (zero >= 2 ? shard_sets + reducing : zero == 1 ? all + shard_sets : all);
  p.gradients_floor = zero >= 2 ? 4 * (shard_sets + certain) : p.gradients;
  const int64_t state_elems = zero >= 1 ? shard_sets : all;
  if (cfg.optim.offload) {
    // On the host: m, v and an f32 master of every element, and one chunk's
    // staging (an f32 gradient and the weights) of the largest shard.
    const int64_t staged = zero >= 1 ? largest_shard : largest_set;
    p.offload += 12 * state_elems + (4 + s) * std::min(staged, optim::AdamWConfig{}.offload_chunk_elems);
  } else {
    p.optimizer = (mixed ? 12 : 8) * state_elems;  // m, v (+ f32 master)
  }

  // The backend's workspace: on a GPU, cuDNN's attention backward and the
  // blocks' weight gradients for this rank's heads and widths (a stage
  // without blocks runs neither), asked of this process's GPU, the one its
  // trainer uses.
  bool has_blocks = false;
  for (const nn::ModelPart& part : parts) has_blocks = has_blocks || part.last_layer > part.first_layer;
  const int64_t D = m.head_dim(), q = sh.q_heads * D, kv = sh.kv_heads * D;
  const bool bias = m.has_bias();
  const int64_t mlp_in = m.mlp_in_width() / at.tp;
  std::vector<ops::AttentionDims> attention;
  std::vector<ops::LinearDims> linears;
  const Device configured = parse_device(cfg.train.device);
  const Device device = configured.is_cuda() ? cfg.device(comm::world_info().size > 1) : configured;
  if (has_blocks) {
    const nn::QkvForm qkv = nn::qkv_form(m, sh, device, at.cp > 1);
    const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len;  // T: a cp rank's 2c rows
    const ops::AttentionDims own{B, T, sh.q_heads, sh.kv_heads, D, cfg.compute_dtype(), cfg.train.deterministic,
                                 qkv == nn::QkvForm::packed};
    attention = {own};
    if (at.cp > 1) {
      // The ring's remote blocks (nn/ring_attention.h): all 2c rows against
      // c keys, and the second chunk's c rows against 2c.
      ops::AttentionDims all_rows = own, second_chunk = own;
      all_rows.causal = second_chunk.causal = false;
      all_rows.Tk = T / 2;
      second_chunk.T = T / 2;
      second_chunk.Tk = T;
      attention.push_back(all_rows);
      attention.push_back(second_chunk);
      const nn::RingBuffers ring =
          nn::ring_attention_buffers(B, T, sh.q_heads, sh.kv_heads, D, cfg.compute_dtype(), at.cp);
      p.ring_comm = ring.comm;
      p.ring_workspace = ring.workspace;
    }
    // GPT-2's mlp.out makes its fp8 input gradient apart, for the GeLU's backward.
    const int64_t gelu_dx = m.arch == nn::Arch::gpt2 ? int64_t(dtype_size(cfg.compute_dtype())) : 0;
    linears = {{m.d_model, q, bias}, {mlp_in, m.d_model, bias}, {m.d_model, sh.ff, bias, gelu_dx}};
    if (qkv == nn::QkvForm::three) {
      // k's and v's input gradients add into q's (an f32 sum); each one's
      // gradient codes are kept from its input gradient to its weight
      // gradient, run after all three input gradients.
      linears.push_back({q, m.d_model, bias, 0, 2 * kv, 2});
      linears.push_back({kv, m.d_model, bias, 4, q + kv, 2});
    } else {
      linears.push_back({q + 2 * kv, m.d_model, bias});
    }
  }
  p.workspace = ops::step_workspace_bytes(device, attention, cfg.train.micro_batch * cfg.train.seq_len, linears,
                                         cfg.train.fp8, cfg.compute_dtype());
  p.offload_on_device = device.is_cpu();

  // Activations: one micro-batch at a time, or under a pipeline schedule
  // this rank's actions in order, each forward adding what its chunk keeps
  // and each backward (zb: its weight pass) releasing it.
  std::vector<ChunkActivations> acts;
  for (const nn::ModelPart& part : parts)
    acts.push_back(chunk_activations(cfg, sh, part, sp, at.pp > 1, cfg.recompute(), at.cp));
  // Under a pipeline every micro-batch of the step is made before its schedule runs.
  const int64_t accum = cfg.grad_accum_steps(at.dp);
  const int64_t batch = batch_bytes(cfg, at.cp);
  if (at.pp == 1) {
    p.activations = batch + acts.front().peak();
    p.offload += acts.front().host_kept;
    return p;
  }
  const parallel::PipelineSchedule kind = parallel::parse_pipeline_schedule(cfg.parallel.pp_schedule);
  const parallel::PipelineShape shape{at.pp, accum, cfg.parallel.virtual_stages};
  parallel::check_pipeline_schedule(kind, shape);
  const std::vector<parallel::Action>& actions = rank_actions(kind, shape, at.pp_rank);
  // The transfers (parallel::receives_before, sends_after), each an (R, C)
  // buffer. The receives the runner holds while an action runs: its own,
  // which lives on beside the copy the chunk works on, and those posted for
  // the next kRecvLookahead - 1 actions. The sends made so far, each until
  // its neighbour has taken it: at most one per micro-batch in flight.
  const int64_t stages = at.pp * cfg.parallel.virtual_stages;
  const auto receives = [&](const parallel::Action& a) {
    return parallel::receives_before(a, a.chunk * at.pp + at.pp_rank, stages);
  };
  const auto sends = [&](const parallel::Action& a) {
    return parallel::sends_after(a, a.chunk * at.pp + at.pp_rank, stages);
  };
  int64_t in_flight = 0, most_in_flight = 0;
  for (const parallel::Action& a : actions) {
    if (a.kind == parallel::ActionKind::forward) most_in_flight = std::max(most_in_flight, ++in_flight);
    if (a.kind == parallel::ActionKind::backward || a.kind == parallel::ActionKind::backward_weight) --in_flight;
  }
  const size_t lookahead = parallel::PipelineRunner::kRecvLookahead;
  int64_t live = batch * (1 + accum), sent = 0, live_host = 0, most_host = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    const parallel::Action& a = actions[i];
    const ChunkActivations& c = acts[size_t(a.chunk)];
    int64_t transfers = std::min(sent, most_in_flight);
    for (size_t j = i; j < std::min(actions.size(), i + lookahead); ++j) transfers += receives(actions[j]) ? 1 : 0;
    const int64_t base = live + transfers * c.rows;
    switch (a.kind) {
      case parallel::ActionKind::forward:
        p.activations = std::max(p.activations, base + c.forward_peak);
        live += c.kept;
        live_host += c.host_kept;
        most_host = std::max(most_host, live_host);
        break;
      case parallel::ActionKind::backward:
        p.activations = std::max(p.activations, base - c.kept + c.backward_peak);
        live -= c.kept;
        live_host -= c.host_kept;
        break;
      case parallel::ActionKind::backward_input:
        p.activations = std::max(p.activations, base - c.kept + std::max(c.backward_peak + c.deferred_gradients,
                                                                         c.backward_input_peak));
        live += c.held_for_weights - c.kept;
        live_host -= c.host_kept;
        break;
      case parallel::ActionKind::backward_weight:
        live -= c.held_for_weights;
        break;
    }
    sent += sends(a) ? 1 : 0;
  }
  p.offload += most_host;
  return p;
}

bool plan_fits(int64_t total_bytes, int64_t capacity_bytes) {
  return capacity_bytes <= 0 || double(total_bytes) <= 1.02 * double(capacity_bytes);
}

MemoryPlan stage_plan(const Config& cfg, const PlanPlace& layout, int64_t pp_rank, PlanPlace* where) {
  MemoryPlan best;
  PlanPlace best_at;
  for (int64_t t = 0; t < layout.tp; ++t) {
    PlanPlace at = layout;
    at.pp_rank = pp_rank;
    at.tp_rank = t;
    const MemoryPlan p = plan_memory(cfg, at);
    if (t == 0 || p.total() > best.total()) best = p, best_at = at;
  }
  if (where) *where = best_at;
  return best;
}

MemoryPlan largest_rank_plan(const Config& cfg, const PlanPlace& layout, PlanPlace* where) {
  MemoryPlan best;
  PlanPlace best_at;
  for (int64_t r = 0; r < layout.pp; ++r) {
    PlanPlace at;
    const MemoryPlan p = stage_plan(cfg, layout, r, &at);
    if (r == 0 || p.total() > best.total()) best = p, best_at = at;
  }
  if (where) *where = best_at;
  return best;
}

int64_t offloaded_activation_bytes(const Config& cfg, const PlanPlace& at) {
  if (!cfg.train.offload_activations) return 0;
  const nn::TpShares sh = nn::tp_shares(cfg.model, at.tp, at.tp_rank, cfg.parallel.ep, 0);
  const bool sp = at.tp > 1 && cfg.parallel.sequence_parallel;
  int64_t bytes = 0;
  for (const nn::ModelPart& part : rank_parts(cfg, at))
    bytes += chunk_activations(cfg, sh, part, sp, at.pp > 1, cfg.recompute(), at.cp).host_kept;
  return bytes;
}

int64_t estimate_activation_bytes(const Config& cfg, nn::Recompute policy) {
  const nn::TpShares sh = nn::tp_shares(cfg.model, 1, 0);
  return batch_bytes(cfg, 1) +
         chunk_activations(cfg, sh, nn::ModelPart{0, cfg.model.n_layer, true, true}, false, false, policy).peak();
}

int64_t device_capacity_bytes(Device device, int64_t processes_sharing) {
  int64_t total = 0;
  if (device.is_cpu()) {
    total = host_meminfo_bytes("MemTotal");
  } else {
#if ZT_WITH_CUDA
    total = int64_t(cuda::device_info(device.index).total_memory);
#endif
  }
  return total / std::max<int64_t>(1, processes_sharing);
}

int64_t usable_share(int64_t free, int64_t total, int64_t held, int64_t processes_sharing) {
  const int64_t p = std::max<int64_t>(1, processes_sharing);
  return std::min(total / p, free / p + held);
}

TrainingMemory training_memory(Device device, int64_t processes_sharing) {
#if ZT_WITH_CUDA
  if (device.is_cuda()) {
    const cuda::DeviceMemory m = cuda::device_memory(device);
    const int64_t held = allocator_for(device).stats().reserved_bytes;
    return {usable_share(m.free, m.total, held, processes_sharing), m.total / std::max<int64_t>(1, processes_sharing),
            m.free, m.total - m.free - held};
  }
#endif
  const int64_t share = device_capacity_bytes(device, processes_sharing);
  return {share, share};
}

std::string format_memory_against_plan(const MemStats& stats, const MemoryPlan& plan) {
  std::array<int64_t, kNumMemCategories> planned;
  planned.fill(-1);  // not planned
  planned[size_t(MemCategory::params)] = plan.weights;
  planned[size_t(MemCategory::grads)] = plan.gradients;
  planned[size_t(MemCategory::optimizer)] = plan.optimizer;
  planned[size_t(MemCategory::activations)] = plan.activations;
  // The ring's: its slots are all a cp run's comm bytes but the scalars';
  // its workspace sits beside the backend's (not planned on the CPU).
  if (plan.ring_comm > 0) planned[size_t(MemCategory::comm)] = plan.ring_comm;
  planned[size_t(MemCategory::workspace)] = plan.workspace >= 0 ? plan.workspace + plan.ring_workspace : -1;
  if (plan.offload_on_device) planned[size_t(MemCategory::offload)] = plan.offload;  // else the host's allocator
  return format_mem_stats(stats, &planned);
}

std::string describe_layout(const PlanPlace& at) {
  // A context-parallel view's dp counts the cp ranks (context_parallel_view).
  return "dp " + std::to_string(at.dp / at.cp) + (at.cp > 1 ? " x cp " + std::to_string(at.cp) : "") + " x tp " +
         std::to_string(at.tp) + " x pp " + std::to_string(at.pp);
}

std::string describe_place(const PlanPlace& at) {
  if (at.dp * at.tp * at.pp == 1) return "";
  std::string where;
  if (at.pp > 1) where += "pp stage " + std::to_string(at.pp_rank);
  if (at.tp > 1) where += std::string(where.empty() ? "" : ", ") + "tp rank " + std::to_string(at.tp_rank);
  return where.empty() ? "every rank" : where;
}

std::string format_memory_plan(const MemoryPlan& p, Device device, int64_t capacity_bytes) {
  // In the unit of the total: MiB under a GiB.
  const bool in_gib = p.total() >= (int64_t(1) << 30);
  const double unit = double(int64_t(1) << (in_gib ? 30 : 20));
  const int digits = in_gib ? 2 : 1;
  char b[256];
  // The terms a plan has only sometimes: the backend's workspace, the ring's buffers.
  std::string optional;
  const auto term = [&](const char* name, int64_t bytes) {
    std::snprintf(b, sizeof b, " + %s %.*f", name, digits, double(bytes) / unit);
    optional += b;
  };
  if (p.workspace >= 0) term("workspace", p.workspace);
  if (p.ring_comm + p.ring_workspace > 0) term("ring attention", p.ring_comm + p.ring_workspace);
  std::snprintf(b, sizeof b, "weights %.*f + gradients %.*f + optimizer %.*f + activations %.*f%s = %.*f %s", digits,
                double(p.weights) / unit, digits, double(p.gradients) / unit, digits, double(p.optimizer) / unit,
                digits, double(p.activations) / unit, optional.c_str(), digits, double(p.total()) / unit,
                in_gib ? "GiB" : "MiB");
  std::string out = b;
  if (capacity_bytes > 0) out += " of " + device.str() + "'s " + format_gib(double(capacity_bytes));
  if (p.offload > 0) {
    std::snprintf(b, sizeof b, "; offloaded to host memory %.*f %s%s", digits, double(p.offload) / unit,
                  in_gib ? "GiB" : "MiB", p.offload_on_device ? " (in the total: the device is the host)" : "");
    out += b;
  }
  return out;
}

std::vector<LayoutPlan> plan_layouts(const Config& cfg, int64_t world) {
  std::vector<LayoutPlan> out;
  for (int64_t tp = 1; tp <= world; ++tp)
    for (int64_t pp = 1; world % tp == 0 && pp <= world / tp; ++pp) {
      const int64_t dp = world / tp / pp;
      if ((world / tp) % pp != 0 || cfg.train.global_batch % (cfg.train.micro_batch * dp) != 0) continue;
      if (cfg.parallel.shard_group > 0 && dp % cfg.parallel.shard_group != 0) continue;
      if (cfg.parallel.sequence_parallel && (cfg.train.micro_batch * cfg.train.seq_len) % tp != 0) continue;
      LayoutPlan lp;
      lp.layout = {dp, tp, pp, 0, 0};
      try {
        nn::check_tensor_parallel(cfg.model, tp);
        lp.plan = largest_rank_plan(cfg, lp.layout, &lp.largest);
      } catch (const Error&) {  // a split this model or schedule cannot run (heads, blocks, micro-batches)
        continue;
      }
      out.push_back(lp);
    }
  // Data parallelism first (the least communication per step), then
  // pipeline before tensor parallelism (which needs the fastest links).
  std::stable_sort(out.begin(), out.end(), [](const LayoutPlan& a, const LayoutPlan& b) {
    return std::make_pair(a.layout.tp * a.layout.pp, a.layout.tp) < std::make_pair(b.layout.tp * b.layout.pp, b.layout.tp);
  });
  return out;
}

std::string memory_plan_verdict(const Config& cfg, const PlanPlace& layout, Device device, int64_t capacity_bytes) {
  PlanPlace worst;
  const MemoryPlan plan = largest_rank_plan(cfg, layout, &worst);
  if (plan_fits(plan.total(), capacity_bytes)) return "";
  const std::string where = describe_place(worst);
  std::string msg = zt::detail::concat("train.micro_batch = ", cfg.train.micro_batch, " would run out of memory on ",
                                       device.str(), ": ",
                                       where.empty() ? "it" : where + " of " + describe_layout(worst),
                                       " needs about ", format_memory_plan(plan, device, 0), " with recompute ",
                                       cfg.train.recompute, ", and ", device.str(), " has ",
                                       format_gib(double(capacity_bytes)), device.is_cuda() ? " free" : "", " for it");
  // What would fit, one of each kind when any does: the largest smaller
  // micro-batch that divides a data-parallel rank's share of the batch
  // (gradient accumulation keeps the global batch), another recompute
  // policy, a higher ZeRO stage, another split of the same processes.
  std::vector<std::string> options;
  // The first of `candidates` (setting, config, layout) that fits, as an option.
  using Candidate = std::tuple<std::string, Config, PlanPlace>;
  const auto first_fit = [&](const std::vector<Candidate>& candidates) {
    for (const auto& [setting, c, l] : candidates) {
      int64_t total = -1;
      try {
        total = largest_rank_plan(c, l).total();
      } catch (const Error&) {  // a setting the layout cannot run (a pipeline schedule's micro-batch count)
        continue;
      }
      if (plan_fits(total, capacity_bytes)) {
        options.push_back(setting + " about " + format_gib(double(total)));
        return;
      }
    }
  };
  std::vector<int64_t> divisors;
  const int64_t g = cfg.train.global_batch / layout.dp;
  for (int64_t d = 1; d * d <= g; ++d)
    if (g % d == 0)
      for (int64_t x : {d, g / d})
        if (x < cfg.train.micro_batch && std::find(divisors.begin(), divisors.end(), x) == divisors.end())
          divisors.push_back(x);
  std::sort(divisors.rbegin(), divisors.rend());
  std::vector<Candidate> batches, zero;
  for (int64_t mb : divisors) {
    Config c = cfg;
    c.train.micro_batch = mb;
    batches.emplace_back(zt::detail::concat("train.micro_batch = ", mb), c, layout);
  }
  // Under a pipeline the step's micro-batches are all made before its
  // schedule runs: the rank's share of the batch's tokens and targets,
  // whatever the micro-batch. Where that alone cannot fit, no smaller one
  // does (and planning each, a schedule of up to g micro-batches, only
  // takes time).
  Config whole_share = cfg;
  whole_share.train.micro_batch = g;
  if (layout.pp == 1 || plan_fits(batch_bytes(whole_share, layout.cp), capacity_bytes)) first_fit(batches);
  for (const char* policy : {"selective", "full"}) {
    if (cfg.train.recompute == policy) continue;
    Config c = cfg;
    c.train.recompute = policy;
    first_fit({{zt::detail::concat("train.recompute = \"", policy, "\""), c, layout}});
  }
  if (layout.dp > 1)
    for (int64_t z = cfg.parallel.zero_stage + 1; z <= 3; ++z) {
      Config c = cfg;
      c.parallel.zero_stage = z;
      zero.emplace_back(zt::detail::concat("parallel.zero_stage = ", z), c, layout);
    }
  first_fit(zero);
  // A GPU's host can hold what the device cannot: the optimizer's state,
  // the blocks' kept activations, or both (at the host link's time each
  // step; on the CPU the host is the device, so nothing is saved).
  if (!device.is_cpu()) {
    Config optimizer = cfg, activations = cfg;
    optimizer.optim.offload = true;
    activations.train.offload_activations = true;
    Config both = optimizer;
    both.train.offload_activations = true;
    std::vector<Candidate> offload;
    if (!cfg.optim.offload) offload.emplace_back("optim.offload = true", optimizer, layout);
    if (!cfg.train.offload_activations) offload.emplace_back("train.offload_activations = true", activations, layout);
    if (!cfg.optim.offload && !cfg.train.offload_activations)
      offload.emplace_back("optim.offload = true with train.offload_activations = true", both, layout);
    first_fit(offload);
  }
  // Under context parallelism (a view: dp counts the cp ranks, seq_len is
  // a cp rank's) the splits that keep the cp group.
  std::vector<Candidate> splits;
  for (const LayoutPlan& lp : plan_layouts(cfg, layout.dp * layout.tp * layout.pp)) {
    PlanPlace l = lp.layout;
    if ((l.dp == layout.dp && l.tp == layout.tp && l.pp == layout.pp) || l.dp % layout.cp != 0) continue;
    l.cp = layout.cp;
    Config c = cfg;
    c.parallel.dp = l.dp, c.parallel.tp = l.tp, c.parallel.pp = l.pp;
    splits.emplace_back(zt::detail::concat("parallel.dp = ", l.dp / l.cp, ", tp = ", l.tp, ", pp = ", l.pp,
                                           l.cp > 1 ? zt::detail::concat(" (cp = ", l.cp, ")") : std::string()),
                        c, l);
  }
  first_fit(splits);
  if (options.empty())
    return msg + "; no smaller micro-batch, recompute policy, ZeRO stage, offloading or split of these processes fits: run on "
                 "more devices, splitting the model (parallel.tp, parallel.pp) or sharding its state (parallel.dp "
                 "with parallel.zero_stage)";
  msg += "; ";
  for (size_t i = 0; i < options.size(); ++i) msg += (i ? ", or " : "") + options[i];
  return msg + " (`zettatron info CONFIG` itemises it)";
}

}  // namespace zt::train
