// The decoder-only transformer with explicit forward and backward passes.
//
// Layers: embeddings (wte (Vp, C) [+ wpe (T_max, C)]) -> n_layer pre-norm
// blocks -> final norm -> LM head (wte when tied). Each layer's parameters are
// one ParamSet (flat buffers). Linear layers are written as the column- and
// row-parallel halves of a Megatron block (qkv and mlp_in column-parallel;
// attn proj and mlp_out row-parallel) with a tensor-parallel group of size 1.
//
// A mixture-of-experts model (ModelConfig::moe) has nn/moe.h's experts and
// router in each block instead of mlp.in / mlp.out; the rest is the same.
//
// Activations of one micro-batch live in a ForwardContext, so several
// micro-batches can be in flight (pipeline schedules need that). What a block
// keeps for its backward pass is set by the recompute policy:
//   none       everything the backward reads
//   selective  the block input, the matmul outputs (q, k, v, mlp_in) and the
//              mid residual; norms, attention and the activation function are
//              recomputed in backward
//   full       only the block input; the block's forward is rerun in backward
// All three give bitwise-identical gradients (deterministic kernels, same
// inputs) - but for GPT-2 under ZT_CUDA_GELU_EPILOGUE=1 on a GPU, where none
// and full take the GeLU from mlp.in's product (cuBLASLt's epilogue: its own
// GeLU) and selective keeps it a pass of its own, so that its recompute has
// the forward's bits: selective's gradients then differ in the last bits.
//
// Tensor parallelism (nn/tensor_parallel.h): each rank's layers hold its
// slices; the residual stream is replicated (R = N = B*T rows) or, under
// sequence parallelism, sharded (R = N/tp rows per rank). Activations below
// marked (R, ...) are this rank's rows; (N, ...) all rows, local heads/width.
//
// The loss is the sum of per-token cross-entropies times grad_scale (the
// trainer passes 1 / tokens in the global batch, so gradient accumulation over
// micro-batches equals one large batch). The LM head is evaluated in row
// chunks fused with the loss and, when training, its backward: the full
// (B*T, Vp) logits matrix is never stored.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/kv_cache.h"
#include "nn/model_config.h"
#include "nn/moe.h"
#include "nn/parallel_linear.h"
#include "nn/params.h"
#include "nn/tensor_parallel.h"
#include "ops/device.h"
#include "ops/norm.h"

namespace zt::nn {

enum class Recompute { none, selective, full };
std::string_view recompute_name(Recompute r);
Recompute parse_recompute(std::string_view s);

// What one block saves for backward (undefined tensors are not kept).
struct BlockActivations {
  Tensor x_in;                   // (R, C)  residual stream into the block
  Tensor ln1;                    // (R, C)  attention norm output
  Tensor ln1_mean, ln1_rstd;     // (R) f32
  Tensor q;                      // (B, T, Hq, D)  after RoPE (local heads)
  Tensor k, v;                   // (B, T, Hkv, D) k after RoPE
  Tensor qkv;                    // (B, T, Hq + 2 Hkv, D) instead of q, k, v under QkvForm::packed
  Tensor att;                    // (B, T, Hq, D)  attention output
  Tensor lse;                    // (B, Hq, T) f32
  Tensor res_mid;                // (R, C)  x_in + attention branch
  Tensor ln2;                    // (R, C)  MLP norm output
  Tensor ln2_mean, ln2_rstd;     // (R) f32
  Tensor mlp_in;                 // (B, T, F) GeLU input, or (B, T, 2F) SwiGLU [gate | up] (local width)
  Tensor act;                    // (B, T, F)  activation output
  MoeActivations moe;            // instead of mlp_in and act under ModelConfig::moe (nn/moe.h);
                                 // mlp_in and act are then the shared expert's (ModelConfig::shared_expert)
};

// Weight-gradient work a zero-bubble backward_input left for backward_weight:
// the work of one parameter set, reported ready (on_grads_ready) after it.
// The work keeps the activations it reads and looks the set's gradient views
// up when it runs (after on_grads_needed): under ZeRO-2 the buffer that was
// current at backward_input may have been reduced and released since.
struct DeferredWeights {
  size_t set = 0;
  std::vector<std::function<void()>> work;
};

struct ForwardContext {
  int64_t B = 0, T = 0;
  bool train = false;
  bool sequence_parallel = false;         // the residual stream is sharded in this pass
  bool context_parallel = false;          // tokens are this rank's zigzag rows (Transformer::context_parallel)
  float grad_scale = 0.0f;
  Tensor tokens;                          // (B, T) i32, a host copy of the batch's tokens
  std::vector<BlockActivations> blocks;   // n_layer
  Tensor x_final;                         // (R, C) residual after the last block
  Tensor lnf_mean, lnf_rstd;              // (R) f32
  Tensor d_lnf;                           // (R, C) gradient at the final norm output (train)
  Tensor targets;                         // (B, T) i32, as the caller passed them (host)
  Tensor head_in;                         // (N, C) final norm output, all rows (head_keeps_dlogits)
  Tensor dlogits;                         // (N, Vl) gradient of this rank's logits (head_keeps_dlogits)
  Tensor token_losses;                    // (N) f32 on the model's device, 0 for ignored targets (head stage)
  double loss_sum = 0.0;                  // sum of token losses (f64); unset under defer_loss_sum
  double aux_loss = 0.0;                  // MoE: this part's blocks' load-balancing losses, summed (nn/moe.h);
                                          // the objective counts it B T grad_scale times, as the token losses
  // MoE, worst block, of its routing call (under cp the micro-batch's):
  double expert_load_max = 0.0;           // the busiest expert's slots over the mean
  double expert_dropped_max = 0.0;        // the share of the slots over capacity
  int64_t loss_tokens = 0;                // tokens with a target >= 0
  std::vector<DeferredWeights> deferred;  // after backward_input: the weight gradients still to compute
  bool weights_pending = false;
  // Training with the head's backward fused into its forward (no pipeline):
  // marked as the LM head starts (after the final norm), so that the
  // trainer's account of the step separates the head - logits, loss and the
  // head's own backward - from the blocks.
  ops::DeviceMark head_start;
};

// Which part of the model an object holds: all of it, or one pipeline
// stage - blocks [first_layer, last_layer) and the embeddings and/or the head.
struct ModelPart {
  int64_t first_layer = 0;
  int64_t last_layer = -1;  // -1: n_layer
  bool embedding = true;
  bool head = true;
};

// The LM head's logits budget per chunk on `device` (elements): 64M on a
// CPU (256 MiB in f32), 256M on a GPU (512 MiB in bf16); the environment's
// ZT_HEAD_CHUNK_ELEMS instead where set (an A/B of the chunk size: the
// weight gradient re-reads its f32 dW once per chunk). The memory plan asks
// the same function, so it follows.
int64_t default_head_chunk_elems(Device device);
// Rows per chunk when `rows` rows of `vocab_rows` logits each run in chunks of
// at most `chunk_elems` logits (at least one row): as few chunks as fit, of
// equal size up to the last.
int64_t head_chunk_rows(int64_t rows, int64_t vocab_rows, int64_t chunk_elems);

// How a block computes q, k and v from the fused qkv weight (rows: Hq query
// heads, Hkv key heads, Hkv value heads, D each):
//   three   three products over its row slices, RoPE in place on q and k.
//   split   one product into (N, (Hq + 2 Hkv) D); the RoPE pass splits it
//           into rotated q, k and copied v and joins their gradients back
//           (so only v's bytes are moved more). Llama on the CPU, where
//           attention would copy a packed tensor's heads anyway.
//   packed  one product whose output attention reads in place, writing the
//           backward's dq, dk, dv in place too (cuDNN takes strided heads;
//           other kernels and the CPU run on copies); Llama's RoPE rotates
//           q and k in place there and v is not moved at all (a sixth less
//           traffic than the split's pass, and no second (N, (Hq + 2 Hkv) D)
//           tensor in forward or backward). Both models on a GPU.
// With one product the input gradient is one product of depth (Hq + 2 Hkv) D
// (not three, the last two adding into the first's output) and the weight
// gradient one of (Hq + 2 Hkv) D rows: Llama 1B's k and v products (512
// columns) and GPT-2's 768-wide ones ran at 37-59% of the GEMM rate alone
// (bench/results/gpu-2026-11-26.md). Three where kv heads are shared by
// several ranks (their weight gradients are partial sums reduced apart).
// ZT_FUSED_QKV=0 asks for three anywhere, 1 for packed also on the CPU
// (where packed means copies; the tests' way to run it), 2 for Llama's split
// also on a GPU (an A/B; GPT-2 has no RoPE pass to split with, so it is
// packed). The memory plan asks the same function. A context-parallel pass
// (context_parallel) takes q, k and v apart (the ring sends k and v and runs
// its blocks on slices of them): packed becomes split for Llama, three for
// GPT-2.
enum class QkvForm { three, split, packed };
QkvForm qkv_form(const ModelConfig& cfg, const TpShares& shares, Device device, bool context_parallel = false);

// Whether a block half adds its residual connection inside its output
// product (linear_forward's residual: res_mid = x_in + proj(att), x_out =
// res_mid + mlp_out(act); no (R, C) branch tensor, no pass of its own), as
// by default, or (ZT_FUSED_RESIDUAL=0, for A/B runs) in the fused residual
// norm and an add after plain products. The memory plan asks too.
bool residual_in_products();

class Transformer {
 public:
  // compute_dtype: f32 or bf16 for parameters and activations (grads are f32).
  // flat_pad_multiple: each layer's flat buffers are padded to a multiple of
  // it (equal data-parallel shards).
  // tp: this rank's tensor-parallel group (default: none). part: a pipeline
  // stage (default: the whole model). A head stage of a model with tied
  // embeddings holds its own copy of embed.wte (owned by the embedding
  // stage: not saved or counted in the gradient norm from here); the
  // pipeline keeps the two in sync by summing their gradients.
  Transformer(const ModelConfig& cfg, DType compute_dtype, Device device = Device::cpu(),
              int64_t flat_pad_multiple = 1, TensorParallel tp = {}, ModelPart part = {});

  const ModelPart& part() const { return part_; }
  bool whole() const { return part_.embedding && part_.head && part_.first_layer == 0 && part_.last_layer == cfg_.n_layer; }
  // Index (into param_sets()) of the set holding embed.wte on this part, or
  // -1: the embeddings, or the head's copy of the tied embedding.
  int64_t tied_embedding_set() const;

  const ModelConfig& config() const { return cfg_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  const TpShares& tp_shares() const { return shares_; }
  // The groups the model communicates over (tp, and the kv replica group):
  // for metrics.
  std::vector<comm::ProcessGroup*> comm_groups() const;
  DType compute_dtype() const { return dtype_; }
  Device device() const { return device_; }
  Recompute recompute = Recompute::none;
  // Context parallelism: the cp group (null or size 1: none). forward,
  // forward_part and the backward passes then take each sequence's rows
  // this rank holds in the zigzag layout (nn/ring_attention.h: (B, T / cp)
  // tokens and targets, T = cp x their length), attention runs as a ring
  // over the group, positions are those of the rows. logits() and
  // logits_part() stay whole-sequence on every rank (the weights are whole
  // on each). CPU only.
  comm::ProcessGroup* context_parallel = nullptr;
  // Training: split the LM head's work like a block's instead of fusing it
  // with the loss in forward. Forward computes the logits, the loss and
  // dlogits (one V x C matmul) and keeps dlogits, (B T, Vl) in the compute
  // dtype per micro-batch in flight; backward computes the input gradient
  // from them (one matmul) and the head's weight gradient (one matmul,
  // deferred by backward_input). Pipelines set it on the head stage so its
  // F : B : W split is the 1 : 1 : 1 the schedules assume. The same loss
  // and gradients either way, bit for bit.
  bool head_keeps_dlogits = false;
  // Logits per chunk of the LM head (elements of this rank's vocabulary
  // slice; see head_chunk_rows). Larger chunks run the head's three matmuls
  // at the sgemm rate (the weight gradient contracts over the chunk's rows:
  // 83 rows ran at 0.48x of 1024 on a 2-core AVX2 CPU) and hold more memory
  // while the head runs. The constructor sets the device's default; tests
  // set it small to cover the chunking.
  int64_t head_chunk_elems = 0;
  // Forward leaves ctx.loss_sum unset and the per-token losses in
  // ctx.token_losses, for the caller to sum later (sum_token_losses): on a GPU
  // reading them waits for the forward, which the trainer defers to the end
  // of the step. forward() still returns the sum (it reads it).
  bool defer_loss_sum = false;
  // The blocks' linear layers (attention's qkv and output, the MLP's two)
  // compute on per-tensor-scaled fp8 operands (train.fp8; parallel_linear.h);
  // the embedding, the LM head, attention's core, a mixture of experts'
  // router and experts stay in the compute dtype.
  bool fp8 = false;
  // Training forward passes move what each block keeps for its backward to
  // host memory once the block is done, and backward brings it back just
  // before the block's turn (nn/activation_offload.h).
  bool offload_activations = false;
  // Bytes of kept activations this model has moved to the host so far (each
  // comes back once more): the host link's traffic, for metrics.
  int64_t offloaded_bytes() const { return offloaded_bytes_; }
  // Aux-loss-free balancing (ModelConfig::router_bias_update_rate): every
  // layer's routing biases, (n_layer, E) f32 row-major over the whole model
  // (this part keeps its layers' rows; empty: none, the plain top k).
  void set_router_bias(const std::vector<float>& all_layers);
  // The routing biases as set_router_bias takes them: (n_layer, E) over the
  // whole model, this part's rows from its tensors, zero outside them (empty:
  // none).
  std::vector<float> router_bias() const;
  // The routed slots per expert of this part's blocks, summed over the
  // training forward passes since the last call (recomputation and
  // evaluation not counted): (n_layer, E) over the whole model, zero outside
  // this part's layers. Resets the count.
  std::vector<int64_t> take_expert_load();
  // Called during backward() with the index (into param_sets()) of a layer
  // whose gradients are complete for this micro-batch: the head first, the
  // blocks from last to first, the embeddings last. Data parallelism starts
  // reducing a layer's gradients here, overlapping the rest of backward.
  std::function<void(size_t set_index)> on_grads_ready;
  // Called before a layer's gradients are first written in a forward or
  // backward pass (ZeRO-2 allocates the layer's gradient buffer here).
  std::function<void(size_t set_index)> on_grads_needed;
  // Called before a layer's weights are read (forward, backward, logits) and
  // after the last read of that use: ZeRO-3 all-gathers the layer here and
  // frees it again.
  std::function<void(size_t set_index)> on_params_needed, on_params_done;

  // Layers in order: embeddings, blocks 0..L-1, head (final norm [+ lm_head]).
  std::vector<ParamSet*> param_sets();
  std::vector<const ParamSet*> param_sets() const;
  int64_t num_params() const;  // elements in all parameter buffers (padding rows included)
  void init_weights(uint64_t seed);
  void zero_grads();
  // A training step's gradients without a zero-fill first: begin_grads
  // before its first micro-batch, finish_grads before anything reads them
  // (ParamSet::begin_grads; each set is also finished before on_grads_ready
  // reports it).
  void begin_grads();
  void finish_grads();
  // The parameter/gradient view with this global name (e.g. "embed.wte"):
  // this rank's slice under tensor parallelism.
  Tensor param(std::string_view name) const;
  Tensor grad(std::string_view name) const;
  // The whole (global) tensor, assembled from every tensor-parallel rank's
  // slice: a collective over the tp group.
  Tensor global_param(std::string_view name) const;
  Tensor global_grad(std::string_view name) const;

  // Forward of one micro-batch: tokens, targets (B, T) i32 (targets < 0 are
  // ignored). When train, activations are kept in ctx per the recompute
  // policy and the head's backward runs fused with the loss, scaled by
  // grad_scale. Returns the summed token loss (also in ctx.loss_sum).
  double forward(ForwardContext& ctx, const Tensor& tokens, const Tensor& targets, bool train, float grad_scale);
  // Backward of a training forward: parameter gradients accumulate (+=).
  // Releases ctx's activations.
  void backward(ForwardContext& ctx);

  // One pipeline stage's passes. tokens and targets (B, T) as for forward;
  // input: the previous stage's output (R, C) (undefined on the embedding
  // stage). Returns this stage's output (R, C), or undefined on the head
  // stage, whose loss is in ctx.loss_sum / ctx.loss_tokens.
  Tensor forward_part(ForwardContext& ctx, const Tensor& input, const Tensor& tokens, const Tensor& targets,
                      bool train, float grad_scale);
  // d_output: gradient of this stage's output (undefined on the head stage).
  // Returns the gradient of its input (undefined on the embedding stage).
  Tensor backward_part(ForwardContext& ctx, const Tensor& d_output);
  // backward_part in two passes (zero-bubble schedules): backward_input
  // computes the input gradient (and the norms' and the LM head's weight
  // gradients, which come with it) and keeps what the weight gradients of
  // the linear layers and the embedding need in ctx; backward_weight computes
  // them and reports each set ready. The same gradients as backward_part,
  // bit for bit.
  Tensor backward_input(ForwardContext& ctx, const Tensor& d_output);
  void backward_weight(ForwardContext& ctx);
  // Full logits (B, T, Vp) in f32 (padding columns included) - for tests,
  // evaluation tools and generation; uses no gradient state. Under tensor
  // parallelism every rank of the group calls it and gets all of them.
  void logits(const Tensor& out, const Tensor& tokens);
  // Each sequence's last position's logits, out (B, Vp) f32 - generation's:
  // the final norm and the head run on those B rows alone (the same values
  // as logits()' last rows).
  void last_logits(const Tensor& out, const Tensor& tokens);
  // Incremental decoding: tokens (B, T) are each sequence's positions
  // [cache.length(), cache.length() + T); they attend to the cached keys and
  // values of the positions before them and to each other (causally), their
  // own are added to the cache, and out (B, Vp) f32 gets each sequence's
  // last position's logits - last_logits() of the whole sequences, to
  // rounding (products over fewer rows; a first call on an empty cache runs
  // the same attention as last_logits). Positions past the cache's capacity
  // are an error: clear it and run the last capacity tokens again.
  void last_logits(const Tensor& out, const Tensor& tokens, KvCache& cache);
  // A cache for this model's (part's) blocks: `batch` sequences of up to
  // `capacity` positions (0: model.max_seq_len, the most there is).
  KvCache make_kv_cache(int64_t batch, int64_t capacity = 0) const;
  // One pipeline stage's part of logits() (last_only: of last_logits()):
  // input (B T, C) from the previous stage (undefined on the embedding
  // stage); returns this stage's output (B T, C), or writes out (B, T, Vp)
  // (last_only: (B, Vp)) f32 on the head stage (and returns undefined). Rows
  // are never sharded here (no sequence parallelism). With a cache (this
  // part's, make_kv_cache) the tokens continue its sequences, as for
  // last_logits with a cache.
  Tensor logits_part(const Tensor& out, const Tensor& input, const Tensor& tokens, bool last_only = false,
                     KvCache* cache = nullptr);

 private:
  struct BlockParams {  // views into one ParamSet; undefined where the arch has none
    Tensor ln1_w, ln1_b, wqkv, bqkv, wq, wk, wv, bq, bk, bv, proj_w, proj_b, ln2_w, ln2_b, mlp_in_w, mlp_in_b,
        mlp_out_w, mlp_out_b;  // wq, wk, wv (bq, bk, bv): row slices of wqkv (bqkv)
    MoeWeights moe;            // instead of mlp_in_w, mlp_out_w under ModelConfig::moe
  };
  BlockParams block_views(size_t layer, bool grads) const;
  struct BlockLinears {  // the block's linear layers over its parameter and gradient views
    ColumnParallelLinear qkv, q, k, v, mlp_in;  // qkv: the three as one (qkv_form)
    RowParallelLinear proj, mlp_out;
  };
  BlockLinears block_linears(size_t layer, const TensorParallel& mode) const;
  // A mixture-of-experts block's shared expert's output product over this
  // rank's columns, without the group's reduction: its partial output is
  // reduced with the routed experts' (p: the block's parameter views).
  RowParallelLinear shared_out(const BlockParams& p, size_t layer) const;
  // Attention's forward on a block's q, k, v (or their packed qkv): a.att,
  // a.lse; a ring over m.context under context parallelism.
  void attention_forward(BlockActivations& a, int64_t B, int64_t T, const TensorParallel& m) const;
  // RoPE's table for a pass's T rows: the model's, or under context
  // parallelism its rows at this rank's positions (built once per T, kept).
  const Tensor& rope_rows(const TensorParallel& m, int64_t T) const;
  ops::NormKind norm_kind() const;
  void check_batch(const Tensor& tokens, const Tensor& targets) const;
  // The parallel setting of a pass: sequence parallelism on or off, context
  // parallelism (context_parallel) on or off.
  TensorParallel pass_mode(bool sequence_parallel, bool context = false) const;
  // Under sequence parallelism: all rows from every rank's shard (blocking,
  // or started into `out` and returned); else the tensor itself.
  Tensor gather_rows(const TensorParallel& m, const Tensor& shard) const;
  // Sums a partial (N, C) over the group into out: out (R, C) rows under
  // sequence parallelism, else out == partial (all-reduced in place).
  comm::WorkHandle start_reduce_rows(const TensorParallel& m, const Tensor& out, const Tensor& partial) const;
  // (R, C); GPT-2's positions start at pos_offset (a KV cache's length).
  Tensor embed(const TensorParallel& m, const Tensor& tokens, int64_t pos_offset = 0) const;
  // A part's input rows: the embeddings of `tokens` (host or device) on the
  // embedding part, else `input` (rows, C) from the previous stage, checked,
  // on the device.
  Tensor part_input(const TensorParallel& m, const Tensor& input, const Tensor& tokens, int64_t rows,
                    int64_t pos_offset = 0) const;
  // cache: the rows are positions [cache->length(), + T) of its sequences
  // (RoPE's angles there; attention over the cached positions too), and
  // their keys and values are stored in it (not advanced: the pass does).
  Tensor block_forward(size_t layer, BlockActivations& a, const Tensor& x_in, int64_t B, int64_t T,
                       const TensorParallel& m, KvCache* cache = nullptr) const;
  // Attention of the new rows' q (a.q, or a.qkv's query heads) against the
  // cached keys and values of block `layer`, theirs stored first: a.att, a.lse.
  void cached_attention(size_t layer, BlockActivations& a, int64_t B, int64_t T, KvCache& cache) const;
  void release_for_policy(BlockActivations& a) const;
  void recompute_for_backward(size_t layer, BlockActivations& a, int64_t B, int64_t T, const TensorParallel& m) const;
  // How a write into these gradient views of param_sets()[set] goes this
  // step (ParamSet::claim_grads; the views of one op must agree).
  ops::GradWrite claim_grads(size_t set, std::initializer_list<Tensor> views);
  // A set's gradients are complete: finished (ParamSet::finish_grads), then
  // reported to on_grads_ready.
  void grads_ready(size_t set);
  // deferred: null runs the weight gradients at once, else queues them
  // there (the experts' in deferred_experts: their own set).
  void block_backward(size_t layer, BlockActivations& a, const Tensor& dres, int64_t B, int64_t T,
                      const TensorParallel& m, std::vector<std::function<void()>>* deferred = nullptr,
                      std::vector<std::function<void()>>* deferred_experts = nullptr);
  Tensor backward_pass(ForwardContext& ctx, const Tensor& d_output, bool defer);
  // The head's backward: returns dL/d x_final (R, C). Under
  // head_keeps_dlogits the input gradient comes from ctx.dlogits here and
  // the head's weight gradient is computed at once, or appended to
  // weight_work when that is given (backward_input).
  Tensor head_backward(ForwardContext& ctx, const TensorParallel& m,
                       std::vector<std::function<void()>>* weight_work);
  // Rows of logits per chunk of the LM head for this rank's vocabulary slice.
  int64_t head_chunk_rows(int64_t N) const;
  // Final norm output (R, C) -> LM head in row chunks fused with the loss and,
  // when training, its backward (into ctx.d_lnf); sets ctx's loss.
  void head_loss(ForwardContext& ctx, const Tensor& lnf_rows, bool train, const TensorParallel& m);
  // Loss (and dlogits, in place) of one chunk of rows of this rank's logits.
  void chunk_loss(const Tensor& losses, const Tensor& logits, const Tensor& targets, bool grad, float grad_scale) const;
  // Finds a parameter by global name: (set, index).
  std::pair<size_t, size_t> locate(std::string_view name) const;
  Tensor head_weight() const;
  Tensor head_grad() const;
  void need(size_t set) const {
    if (on_params_needed) on_params_needed(set);
  }
  void done(size_t set) const {
    if (on_params_done) on_params_done(set);
  }
  // Indices into param_sets() (the embeddings only on the embedding part).
  // A mixture-of-experts block's experts are the set after its block's.
  size_t sets_per_block() const { return experts_.empty() ? 1 : 2; }
  size_t block_set(size_t i) const { return (part_.embedding ? 1 : 0) + i * sets_per_block(); }
  size_t expert_set(size_t i) const { return block_set(i) + 1; }
  size_t head_set() const { return block_set(blocks_.size()); }
  // The sets a block's weights live in: its own (and its experts').
  std::vector<size_t> block_sets(size_t i) const {
    return experts_.empty() ? std::vector<size_t>{block_set(i)} : std::vector<size_t>{block_set(i), expert_set(i)};
  }
  // The set whose weights the LM head reads (the head's own, or the
  // embeddings' when tied on a whole model).
  size_t head_weight_set() const;

  ModelConfig cfg_;
  DType dtype_;
  Device device_;
  TensorParallel tp_;
  TpShares shares_;
  ModelPart part_;
  std::unique_ptr<comm::ProcessGroup> kv_group_;  // ranks sharing kv heads (Hkv < tp)
  QkvForm qkv_form_ = QkvForm::three;              // qkv_form(cfg_, shares_, device_)
  QkvForm cp_qkv_form_ = QkvForm::three;           // the same for a context-parallel pass
  QkvForm form_of(const TensorParallel& m) const { return m.context ? cp_qkv_form_ : qkv_form_; }
  bool residual_in_products_ = true;               // residual_in_products()
  ParamSet embed_;               // wte (Vp, C) [, wpe (T_max, C)]
  std::vector<ParamSet> blocks_;
  std::vector<ParamSet> experts_;  // MoE: per block, mlp.experts.{in,out}.weight (empty for dense models)
  ParamSet head_;                // final_norm.weight (C) [, .bias] [, lm_head.weight (Vp, C)]
  Tensor rope_table_;            // (T_max, D/2, 2) f32 (llama3)
  mutable Tensor cp_rope_table_;  // (T, D/2, 2): rope_table_'s rows at a cp rank's positions
  mutable int64_t cp_rope_rows_ = 0;
  int64_t offloaded_bytes_ = 0;  // offloaded_bytes()
  std::vector<Tensor> router_bias_;  // MoE: per block, (E) f32 (set_router_bias; empty: none)
  std::vector<int64_t> expert_load_;  // MoE: (blocks, E) training slots since take_expert_load
};

// The sum of a forward's per-token losses (ForwardContext::token_losses), in
// f64 in token order: the loss sum forward reports. Reads them on the host.
double sum_token_losses(const Tensor& token_losses);

}  // namespace zt::nn
