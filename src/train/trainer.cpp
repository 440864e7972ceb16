#include "train/trainer.h"

#include "parallel/pipeline_stages.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "backend/cpu/blas_kernels.h"
#include "backend/cpu/peak_rate.h"
#if ZT_WITH_CUDA
#include "backend/cuda/kernel_race.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/runtime.h"
#endif
#include "core/error.h"
#include "core/determinism.h"
#include "nn/ring_attention.h"
#include "ops/device.h"
#include "ops/op_profile.h"
#include "train/checkpointing.h"
#include "train/generate.h"
#include "train/step_trace.h"

namespace zt::train {

using nlohmann::json;

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
std::string format_mib(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
// How many of this node's processes share `device`'s memory: all of them
// share the host's; a GPU is shared when there are more processes than GPUs
// (parallel.comm_backend = mpi), unless the user placed each process on a
// GPU of its own (train.device = "cuda:N": a launcher that binds one GPU per
// process, so each sees fewer GPUs than the node's processes).
int64_t processes_sharing_device(Device device, bool multi_process, bool by_local_rank) {
  if (!multi_process) return 1;
  const comm::WorldInfo w = comm::world_info();
  if (device.is_cpu()) return w.local_size;
  if (!by_local_rank) return 1;
  const int64_t gpus = std::max(1, ops::gpu_count());
  return (w.local_size + gpus - 1) / gpus;
}
// Test-only fault injection: ZT_TRAIN_FAILPOINT=STEP throws a zt::Error at
// the start of that step on a process whose environment has it - one rank's
// failure mid-run (a bad disk, a bad batch) while its peers go on.
void failpoint(int64_t step) {
  static const char* fp = std::getenv("ZT_TRAIN_FAILPOINT");
  if (fp != nullptr && std::to_string(step) == fp)
    ZT_FAIL("ZT_TRAIN_FAILPOINT=", fp, ": this rank fails at the start of step ", step);
}
}  // namespace

json BatchSource::state() const {
  ZT_FAIL("this data source cannot be saved in a checkpoint (it has no position to restore)");
}
void BatchSource::restore(const json&) {
  ZT_FAIL("this data source cannot be restored from a checkpoint");
}

Trainer::~Trainer() = default;

std::vector<nn::ParamSet*> Trainer::param_sets() {
  std::vector<nn::ParamSet*> out;
  for (auto& c : chunks_)
    for (nn::ParamSet* s : c->param_sets()) out.push_back(s);
  return out;
}

std::vector<const nn::ParamSet*> Trainer::param_sets() const {
  std::vector<const nn::ParamSet*> out;
  for (const auto& c : chunks_)
    for (const nn::ParamSet* s : static_cast<const nn::Transformer&>(*c).param_sets()) out.push_back(s);
  return out;
}

Trainer::Trainer(const Config& cfg, std::unique_ptr<BatchSource> train, std::unique_ptr<BatchSource> val,
                 std::unique_ptr<TextCodec> codec, std::shared_ptr<parallel::Mesh> mesh)
    : cfg_(cfg), mesh_(std::move(mesh)), train_(std::move(train)), val_(std::move(val)), codec_(std::move(codec)) {
  cfg_.validate();
  ZT_CHECK(train_ != nullptr, "the trainer needs a training data source");
  const Device device = cfg_.device(mesh_ != nullptr);
  ops::init_device(device);  // a clear error now if this build or machine has no such device
  cfg_.check_layout(mesh_ ? mesh_->shape() : parallel::MeshShape{});
  {
    // A run that cannot fit stops now, before allocating, saying what would
    // fit: the plan of the layout's largest rank (a pure function of the
    // config) against the smallest device of the job, so that every rank
    // reaches the same verdict.
    PlanPlace mesh_layout;
    if (mesh_) mesh_layout = {mesh_->shape().dp, mesh_->shape().tp, mesh_->shape().pp, 0, 0};
    // Context parallelism as the plan counts it: dp x cp replicas of seq_len / cp tokens.
    const PlanView view = context_parallel_view(cfg_, mesh_layout);
    const PlanPlace& layout = view.layout;
    // A GPU's free memory: the CUDA context, the libraries and NCCL's
    // communicators (the mesh's, made by now) hold theirs already.
    const TrainingMemory room =
        training_memory(device, processes_sharing_device(device, mesh_ != nullptr, cfg_.gpu_by_local_rank()));
    // The minimum over the job: the mesh's dp, tp, pp and cp groups in turn cover every rank.
    const auto job_min = [this](int64_t bytes) {
      if (mesh_)
        for (comm::ProcessGroup* g : {&mesh_->dp(), &mesh_->tp(), &mesh_->pp(), &mesh_->cp()})
          for (double c : comm::all_gather_doubles(*g, double(bytes))) bytes = std::min(bytes, int64_t(c));
      return bytes;
    };
    const int64_t capacity = job_min(room.usable);
    outside_at_plan_ = room.outside;
    const std::string verdict = memory_plan_verdict(view.cfg, layout, device, capacity);
    ZT_CHECK(verdict.empty(), verdict);
    if (!device.is_cpu()) {
      // What a GPU run offloads waits in the host's memory, which the
      // node's processes share (on the CPU it is in the plan's total): the
      // largest stage's share against the smallest host's, as above.
      int64_t offload = 0;
      for (int64_t r = 0; r < layout.pp; ++r) offload = std::max(offload, stage_plan(view.cfg, layout, r).offload);
      if (offload > 0) {
        const int64_t host = job_min(device_capacity_bytes(Device::cpu(), mesh_ ? comm::world_info().local_size : 1));
        ZT_CHECK(plan_fits(offload, host), "the offloaded state of the largest rank needs ",
                 format_gib(double(offload)), " of host memory, but each process has ", format_gib(double(host)),
                 " (the host's memory over the processes on it); offload less (optim.offload = false or "
                 "train.offload_activations = false), shard the optimizer's state (parallel.zero_stage >= 1) or "
                 "spread the job over more nodes");
      }
    }
    PlanPlace at = layout;
    if (mesh_) at.tp_rank = mesh_->coord().tp, at.pp_rank = mesh_->coord().pp;
    const std::string where = describe_place(at);
    rank_plan_ = plan_memory(view.cfg, at);
    memory_plan_ = format_memory_plan(rank_plan_, device, capacity) +
                   (device.is_cuda() ? " free (of " + format_gib(double(room.total)) + ")" : "") +
                   (where.empty() ? "" : " (" + where + " of " + describe_layout(at) + ")") +
                   (cfg_.parallel.cp > 1 ? "; context parallelism planned as dp x cp replicas of seq_len / cp = " +
                                               std::to_string(view.cfg.train.seq_len) + " tokens"
                                         : "");
  }
  schedule_ = cfg_.lr_schedule();
  if (const auto ls = cfg_.loss_scaling()) {
    scaler_.emplace(*ls);
    progress_.loss_scale = scaler_->initial();
  }
  if (!mesh_) solo_dp_ = comm::make_solo_group("dp");
  // Context parallelism: each cp rank runs its rows of the same sequences,
  // so the gradients sum over dp x cp and ZeRO shards over it.
  const int64_t cp = mesh_ ? mesh_->cp().size() : 1;
  comm::ProcessGroup& dp_group = !mesh_ ? *solo_dp_ : cp > 1 ? mesh_->dp_cp() : mesh_->dp();
  main_rank_ = !mesh_ || mesh_->world_rank() == 0;
  data_ranks_ = mesh_ ? mesh_->shape().dp : 1;
  const int64_t dp = dp_group.size();
  // ZeRO shards are equal, aligned slices of each layer's flat buffers.
  const int64_t pad = parallel::zero_pad_multiple(cfg_.parallel.zero_stage, dp);
  // Tensor parallelism: this rank's slices of every layer (the mesh's tp group).
  nn::TensorParallel tp;
  if (mesh_ && mesh_->tp().size() > 1) tp = {&mesh_->tp(), cfg_.parallel.sequence_parallel};
  // Expert parallelism: each ep rank holds E / ep experts of every block (nn/moe.h).
  const int64_t ep = mesh_ ? mesh_->ep().size() : 1;
  if (ep > 1) tp.experts = &mesh_->ep();
  // Pipeline parallelism: this rank's model chunks (stage c p + rank for chunk c).
  const int64_t pp = mesh_ ? mesh_->pp().size() : 1, v = pp > 1 ? cfg_.parallel.virtual_stages : 1;
  std::vector<nn::ModelPart> parts{nn::ModelPart{}};
  if (pp > 1) {
    const auto plan = parallel::plan_pipeline_stages(cfg_.model, cfg_.train.seq_len, pp * v,
                                                     parallel::parse_stage_layers(cfg_.parallel.pp_layers));
    parts.clear();
    for (int64_t c = 0; c < v; ++c) {
      const parallel::StageLayers& st = plan[size_t(c * pp + mesh_->pp().rank())];
      parts.push_back({st.first, st.last, st.embedding, st.head});
    }
  }
  size_t offset = 0;  // of each chunk's sets in param_sets()
  for (const nn::ModelPart& part : parts) {
    chunks_.push_back(std::make_unique<nn::Transformer>(cfg_.model, cfg_.compute_dtype(), device, pad, tp, part));
    nn::Transformer& m = *chunks_.back();
    m.recompute = cfg_.recompute();
    m.context_parallel = cp > 1 ? &mesh_->cp() : nullptr;
    m.defer_loss_sum = pp == 1;  // train_step sums the micro-batches' losses at the end of the step
    m.fp8 = cfg_.train.fp8;
    m.offload_activations = cfg_.train.offload_activations;
    m.init_weights(uint64_t(cfg_.train.seed));
    // A pipeline's tied embedding is reduced over dp after its two copies are summed.
    const int64_t tied = pp > 1 ? m.tied_embedding_set() : -1;
    m.on_grads_ready = [this, offset, tied](size_t set) {
      if (int64_t(set) != tied) dp_->grads_ready(offset + set);
    };
    m.on_grads_needed = [this, offset](size_t set) { dp_->grads_needed(offset + set); };
    m.on_params_needed = [this, offset](size_t set) { dp_->params_needed(offset + set); };
    m.on_params_done = [this, offset](size_t set) { dp_->params_done(offset + set); };
    offset += m.param_sets().size();
  }
  parallel::DataParallelOptions dpo;
  dpo.zero_stage = cfg_.parallel.zero_stage;
  dpo.bucket_bytes = int64_t(cfg_.parallel.bucket_mb * double(1 << 20));
  dpo.shard_group = cfg_.parallel.shard_group;
  // The experts' sets reduce and shard over the ranks holding the same
  // experts; their norm sums over the ep group.
  parallel::SetGroups own;
  if (ep > 1) {
    for (const nn::ParamSet* s : param_sets())
      own.groups.push_back(s->size() > 0 && nn::is_expert_param(s->spec(0).name) ? &mesh_->ep_dp() : nullptr);
    own.norm_group = &mesh_->ep();
  }
  dp_ = std::make_unique<parallel::DataParallel>(param_sets(), dp_group, dpo, std::move(own));
  if (pp > 1) {
    std::vector<nn::Transformer*> raw;
    for (auto& c : chunks_) raw.push_back(c.get());
    pipeline_ = std::make_unique<parallel::PipelineRunner>(mesh_->pp(), raw,
                                                           parallel::parse_pipeline_schedule(cfg_.parallel.pp_schedule));
    pipeline_->before_backward = [this](int64_t, bool last) { dp_->begin_backward(last); };
  }
  // Every rank that writes a part: the dp ranks, and their tensor-parallel peers.
  if (mesh_ && mesh_->shape().world() > 1)
    ckpt_group_ = comm::world().split(0, int(mesh_->world_rank()), "ckpt");
  else
    ckpt_group_ = comm::make_solo_group("ckpt");
  if (cfg_.model.router_bias_update_rate > 0) {
    set_router_bias({});  // zeros
    if (mesh_ && mesh_->shape().world() > 1)
      balance_group_ = comm::world().split(0, int(mesh_->world_rank()), "router_bias");
  }
  optimizer_ = std::make_unique<optim::AdamW>(param_sets(), cfg_.adamw(), dp_->optimizer_shards());
  inputs_ = Tensor::empty(Shape{cfg_.train.micro_batch, cfg_.train.seq_len}, DType::i32);
  targets_ = Tensor::empty(Shape{cfg_.train.micro_batch, cfg_.train.seq_len}, DType::i32);
  if (cfg_.metrics.peak_gflops > 0) {
    peak_gflops_ = cfg_.metrics.peak_gflops;
    peak_source_ = "configured";
  } else if (device.is_cpu()) {
    peak_gflops_ = cpu::measure_sgemm_gflops();
    // Which kernels that rate is of: a stale OpenBLAS pick is several times slower (blas_kernels.h).
    peak_source_ = "measured sgemm, " + cpu::describe_blas_kernels();
  } else {
#if ZT_WITH_CUDA
    const cuda::DeviceInfo info = cuda::device_info(device.index);
    ZT_CHECK(info.peak_bf16_tflops > 0, "no datasheet peak is known for ", info.name,
             "; set metrics.peak_gflops to its dense bf16 rate (GFLOP/s) so MFU can be reported");
    peak_gflops_ = info.peak_bf16_tflops * 1e3;
    peak_source_ = "datasheet dense bf16, " + info.name;
#endif
  }
  log = [](const std::string& line) { std::cout << line << std::endl; };
}

Tensor Trainer::model_rows(const Tensor& batch) const {
  if (!cp_group()) return batch;
  return nn::shard_rows(batch, nn::context_shard(batch.size(1), cp_group()->size(), cp_group()->rank()));
}

StepMetrics Trainer::train_step(int64_t step) {
  const auto t_step = Clock::now();
  const DeterminismScope determinism(cfg_.train.deterministic);  // the step's ops (core/determinism.h)
  StepMetrics m;
  m.step = step + 1;
  comm::set_current_step(m.step);  // named by the comm watchdog if a collective hangs
  failpoint(m.step);
  std::vector<comm::CommStats> tp_start;
  for (comm::ProcessGroup* g : model().comm_groups()) tp_start.push_back(g->stats());
  const comm::CommStats cp_start = cp_group() ? cp_group()->stats() : comm::CommStats{};
  const comm::CommStats ep_start = ep_group() ? ep_group()->stats() : comm::CommStats{};
  m.total_steps = cfg_.train.steps;
  if (ops::op_profile_enabled()) (void)ops::take_op_profile();  // evaluation's and sampling's ops are not the step's
  const int64_t accum = cfg_.grad_accum_steps(data_ranks_), T = cfg_.train.seq_len;
  m.tokens = cfg_.train.global_batch * T;
  // Loss is the mean over every token of the global batch, so each
  // micro-batch's gradient is scaled by 1 / (tokens in the global batch),
  // times the loss scale (a power of two: exact) under loss scaling.
  m.loss_scale = progress_.loss_scale.scale;
  const double loss_scale = scaler_ ? m.loss_scale : 1.0;
  const float grad_scale = float(loss_scale / double(m.tokens));
  const Device device = model().device();
  // metrics.trace_step: this step's timeline (train/step_trace.h).
  const bool tracing = cfg_.metrics.trace_step == m.step;
  if (tracing) begin_step_trace(device);
  // metrics.profiler_capture_step: this step's launches, from its first to
  // its optimizer's, are what a profiler started with capture off records.
  const bool capture = cfg_.metrics.profiler_capture_step == m.step;
  if (capture) ops::profiler_capture(device, true);
  allocator_for(device).reset_peak();
  // The chunks' kept activations moved to the host so far (the step's: the difference).
  const auto offloaded = [this] {
    int64_t bytes = 0;
    for (const auto& c : chunks_) bytes += c->offloaded_bytes();
    return bytes;
  };
  const int64_t offloaded_before = offloaded();
  // No zeros written first: each gradient's first write of the step
  // overwrites it (nn::Transformer::begin_grads).
  for (auto& c : chunks_) c->begin_grads();
  dp_->begin_step();
  double loss_sum = 0, aux_weighted = 0;
  if (pipeline_) {
    // Every micro-batch of the step, then the schedule over them.
    auto t0 = Clock::now();
    std::vector<parallel::PipelineMicroBatch> mbs;
    for (int64_t micro = 0; micro < accum; ++micro) {
      parallel::PipelineMicroBatch mb{Tensor::empty(inputs_.shape(), DType::i32), Tensor::empty(targets_.shape(), DType::i32)};
      train_->next(mb.tokens, mb.targets);
      mbs.push_back({model_rows(mb.tokens), model_rows(mb.targets)});
    }
    m.data_seconds += seconds_since(t0);
    trace_span("host", "data", t0, Clock::now());
    t0 = Clock::now();
    const parallel::PipelineRunner::StepResult res = pipeline_->run(mbs, grad_scale);
    pipeline_->sync_tied_embedding();  // both copies' shares summed before the dp reduction
    trace_span("host", "pipeline schedule", t0, Clock::now());
    if (tracing) {
      // The schedule's actions on this rank (seconds since it began, on the host clock).
      const double t0_us = std::chrono::duration<double, std::micro>(t0 - trace_origin()).count();
      for (const parallel::PipelineEvent& e : pipeline_->events())
        trace_span_us("step",
                      e.name + (e.micro_batch >= 0 ? " (micro-batch " + std::to_string(e.micro_batch + 1) + ")" : "") +
                          (chunks_.size() > 1 ? " chunk " + std::to_string(e.chunk) : ""),
                      t0_us + 1e6 * e.start, 1e6 * (e.end - e.start));
    }
    m.forward_seconds += res.forward_seconds;
    m.pp_run_seconds = res.seconds;
    m.pp_compute_seconds = res.compute_seconds;
    m.pp_idle_seconds = res.idle_seconds;
    m.pp_peak_in_flight = res.peak_in_flight;
    if (cfg_.metrics.pipeline_trace_step == step + 1) {
      // Every stage's timeline of this step, viewable in Perfetto.
      const auto events = parallel::gather_pipeline_events(mesh_->pp(), pipeline_->events());
      if (main_rank_) {
        const std::string path = cfg_.train.run_dir + "/pipeline_trace.json";
        std::ofstream(path) << parallel::chrome_trace_json(events);
        log("pipeline trace of step " + std::to_string(step + 1) + ": " + path + " (open in https://ui.perfetto.dev)");
      }
    }
    loss_sum = comm::sum_exact(mesh_->pp(), res.loss_sum);
    aux_weighted = comm::sum_exact(mesh_->pp(), res.aux_weighted);  // each stage's blocks
    m.expert_load_max = res.expert_load_max;
    m.expert_dropped_max = res.expert_dropped_max;
    if (cfg_.model.moe()) {  // every stage's blocks
      m.expert_load_max = comm::max_over(mesh_->pp(), m.expert_load_max);
      m.expert_dropped_max = comm::max_over(mesh_->pp(), m.expert_dropped_max);
    }
    m.backward_seconds += res.compute_seconds - res.forward_seconds;  // waiting (the bubble) is in neither
  }
  // No wait for the GPU inside the loop: the micro-batches' losses are read,
  // and their forward and backward times (marks on the device's stream), at
  // the end.
  struct MicroBatchMarks {
    ops::DeviceMark start, head_start, forward_done, backward_done;
  };
  std::vector<MicroBatchMarks> marks;
  std::vector<Tensor> token_losses;
  for (int64_t micro = 0; !pipeline_ && micro < accum; ++micro) {
    auto t0 = Clock::now();
    train_->next(inputs_, targets_);
    m.data_seconds += seconds_since(t0);
    trace_span("host", "data", t0, Clock::now());
    MicroBatchMarks& mk = marks.emplace_back();
    mk.start = ops::DeviceMark(device);
    nn::ForwardContext ctx;
    dp_->set_prefetch(+1);
    model().forward_part(ctx, Tensor(), model_rows(inputs_), model_rows(targets_), true, grad_scale);  // loss sum deferred
    token_losses.push_back(ctx.token_losses);  // backward releases ctx
    aux_weighted += ctx.aux_loss * double(ctx.B * ctx.T);
    m.expert_load_max = std::max(m.expert_load_max, ctx.expert_load_max);
    m.expert_dropped_max = std::max(m.expert_dropped_max, ctx.expert_dropped_max);
    mk.forward_done = ops::DeviceMark(device);
    mk.head_start = std::move(ctx.head_start);
    dp_->begin_backward(micro + 1 == accum);  // only the last micro-batch reduces (ZeRO < 2)
    dp_->set_prefetch(-1);
    model().backward(ctx);
    dp_->set_prefetch(0);
    mk.backward_done = ops::DeviceMark(device);
  }
  for (size_t i = 0; i < marks.size(); ++i) {
    // The whole model's LM head runs in the forward pass with its own
    // backward fused in: counted apart, so that "fwd" is the blocks' forward.
    const MicroBatchMarks& mk = marks[i];
    m.forward_seconds += mk.head_start.seconds_since(mk.start);
    m.head_seconds += mk.forward_done.seconds_since(mk.head_start);
    m.backward_seconds += mk.backward_done.seconds_since(mk.forward_done);
    if (tracing) {
      const std::string mb = " (micro-batch " + std::to_string(i + 1) + ")";
      ops::trace_device_span("step", "forward" + mb, mk.start, mk.head_start);
      ops::trace_device_span("step", "head + its backward" + mb, mk.head_start, mk.forward_done);
      ops::trace_device_span("step", "backward" + mb, mk.forward_done, mk.backward_done);
    }
  }
  for (const Tensor& l : token_losses) loss_sum += nn::sum_token_losses(l);
  for (auto& c : chunks_) c->finish_grads();  // every set is finished when reported ready: a safety net
  const auto t_reduce = Clock::now();
  dp_->finish_reduction();
  loss_sum = dp_->sum(loss_sum);
  if (cfg_.model.moe()) {
    m.router_aux_loss = dp_->sum(aux_weighted) / double(m.tokens);  // dp (x cp) ranks' tokens
    m.expert_load_max = dp_->max(m.expert_load_max);                // the worst rank's
    m.expert_dropped_max = dp_->max(m.expert_dropped_max);
  }
  m.backward_seconds += seconds_since(t_reduce);
  trace_span("host", "gradient reduction: the rest", t_reduce, Clock::now());
  m.loss = loss_sum / double(m.tokens);
  const auto t_opt = Clock::now();
  if (before_update) before_update(step);
  // The norm of the scaled gradients (the same on every rank: summed over
  // every group), unscaled exactly.
  m.grad_norm = dp_->grad_norm(*optimizer_, {tp_group(), pp_group()}) / loss_scale;
  m.lr = schedule_.at(step);
  // An overflow under loss scaling: the scale was too large for this step's
  // gradients. Skip it and back off; at a scale of 1 or less the gradients
  // are not finite unscaled either, which is a bad step.
  if (scaler_ && std::isfinite(m.loss) && !std::isfinite(m.grad_norm) && loss_scale > 1.0) {
    m.skipped = m.overflow = true;
    ++progress_.overflow_steps;
    scaler_->update(progress_.loss_scale, true);
  } else if (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm)) {
    m.skipped = true;
    ++progress_.bad_steps;
    if (progress_.bad_steps >= cfg_.train.max_bad_steps) {
      ZT_FAIL("training stopped at step ", m.step, ": loss ", m.loss, ", grad norm ", m.grad_norm, " (not finite) for ",
              progress_.bad_steps, " consecutive step(s); last good values: step ", progress_.last_good_step + 1,
              ", loss ", progress_.last_good_loss, "; lower optim.lr, keep optim.grad_clip on, or check the data (train.max_bad_steps "
              "sets how many such steps are skipped before stopping)");
    }
  } else {
    progress_.bad_steps = 0;
    progress_.last_good_loss = m.loss;
    progress_.last_good_step = step;
    optimizer_->step(m.lr, optim::clip_scale(m.grad_norm, cfg_.optim.grad_clip) / loss_scale);
    dp_->gather_params(*optimizer_);
    if (scaler_) scaler_->update(progress_.loss_scale, false);
  }
  if (cfg_.model.router_bias_update_rate > 0) update_router_bias(!m.skipped);
  if (ops::op_profile_enabled()) {
    ops::synchronize(device);  // the step's GPU work inside its time, so the op shares add up
    m.op_totals = ops::take_op_profile();
  }
  if (capture) ops::profiler_capture(device, false);
  m.optimizer_seconds = seconds_since(t_opt);
  trace_span("host", "norm, optimizer step", t_opt, Clock::now());
  m.step_seconds = seconds_since(t_step);
  progress_.tokens_seen += m.tokens;
  progress_.steps_done = step + 1;
  m.tokens_seen = progress_.tokens_seen;
  m.tokens_per_second = double(m.tokens) / m.step_seconds;
  // The peak is per device; the job has one device per rank.
  m.world = mesh_ ? mesh_->shape().world() : 1;
  m.mfu = cfg_.model.train_flops_per_token(T) * m.tokens_per_second / (peak_gflops_ * 1e9 * double(m.world));
  m.memory = allocator_for(device).stats();
  m.offload_host_bytes = allocator_for(Device::cpu()).stats().current(MemCategory::offload);
  m.offloaded_activation_bytes = offloaded() - offloaded_before;
  m.max_peak_memory = dp_->highest_peak(m.memory, &m.max_peak_rank);
  const parallel::DataParallel::StepComm sc = dp_->take_step_comm();
  m.dp_comm = {dp_->size(), sc.bytes, sc.busy_seconds, sc.wait_seconds};
  if (pipeline_) {
    // Every stage's bubble (the share of the schedule's span it did not
    // compute), waits and activations in flight, on every rank.
    m.pp_size = mesh_->pp().size();
    const double mine[] = {m.pp_run_seconds, m.pp_compute_seconds, m.pp_idle_seconds, double(m.pp_peak_in_flight)};
    const std::vector<double> all = comm::all_gather_doubles(mesh_->pp(), mine);  // 4 per stage
    double span = 0;
    for (int64_t r = 0; r < m.pp_size; ++r) span = std::max(span, all[size_t(4 * r)]);
    for (int64_t r = 0; r < m.pp_size; ++r) {
      const double* st = &all[size_t(4 * r)];
      m.pp_bubble_per_stage.push_back(span > 0 ? 1.0 - st[1] / span : 0.0);
      m.pp_wait_per_stage.push_back(span > 0 ? st[2] / span : 0.0);
      m.pp_in_flight_per_stage.push_back(int64_t(st[3]));
    }
    // Theory as a share of the step: idle / (work + idle).
    const double b = parallel::theoretical_bubble(parallel::parse_pipeline_schedule(cfg_.parallel.pp_schedule),
                                                  {m.pp_size, accum, int64_t(chunks_.size())});
    m.pp_bubble_theory = b / (1.0 + b);
  }
  // Tensor-parallel traffic of this step (the model's groups; evaluation and
  // sampling between steps are not counted).
  const auto groups = model().comm_groups();
  m.tp_comm.size = tp_group() ? tp_group()->size() : 1;
  for (size_t i = 0; i < groups.size(); ++i) m.tp_comm.add(groups[i]->stats(), tp_start[i]);
  if (cp_group()) {  // the ring attention's sends and receives
    m.cp_comm.size = cp_group()->size();
    m.cp_comm.add(cp_group()->stats(), cp_start);
  }
  if (ep_group()) {  // the experts' all-to-alls
    m.ep_comm.size = ep_group()->size();
    m.ep_comm.add(ep_group()->stats(), ep_start);
  }
  if (tracing) {
    const std::vector<RankTrace> ranks = end_step_trace(device, mesh_.get());  // a collective over the mesh
    if (main_rank_) {
      std::error_code ec;
      std::filesystem::create_directories(cfg_.train.run_dir, ec);  // train_step may run without run()
      const std::string path = cfg_.train.run_dir + "/trace.json";
      std::ofstream out(path);
      out << chrome_trace_json(ranks);
      ZT_CHECK(out.good(), "metrics.trace_step: cannot write ", path);
      log("trace of step " + std::to_string(m.step) + ": " + path + " (open in https://ui.perfetto.dev)");
    }
  }
  return m;
}

double Trainer::evaluate(int64_t* tokens_out) {
  ZT_CHECK(val_ != nullptr, "evaluate: no validation data");
  return evaluate(*val_, tokens_out);
}

double Trainer::evaluate(BatchSource& val, int64_t* tokens_out) {
  val.reset();
  double loss_sum = 0;
  int64_t tokens = 0;
  if (pipeline_) {
    std::vector<parallel::PipelineMicroBatch> mbs;
    for (int64_t i = 0; i < cfg_.train.eval_batches; ++i) {
      parallel::PipelineMicroBatch mb{Tensor::empty(inputs_.shape(), DType::i32), Tensor::empty(targets_.shape(), DType::i32)};
      val.next(mb.tokens, mb.targets);
      mbs.push_back({model_rows(mb.tokens), model_rows(mb.targets)});
    }
    const parallel::PipelineRunner::StepResult r = pipeline_->evaluate(mbs);
    loss_sum = comm::sum_exact(mesh_->pp(), r.loss_sum);
    tokens = int64_t(comm::sum_exact(mesh_->pp(), double(r.loss_tokens)));
  }
  for (int64_t i = 0; !pipeline_ && i < cfg_.train.eval_batches; ++i) {
    val.next(inputs_, targets_);
    nn::ForwardContext ctx;
    loss_sum += model().forward(ctx, model_rows(inputs_), model_rows(targets_), false, 0.0f);
    tokens += ctx.loss_tokens;
  }
  if (cp_group()) {  // each cp rank saw its rows of the sequences
    loss_sum = comm::sum_exact(*cp_group(), loss_sum);
    tokens = int64_t(comm::sum_exact(*cp_group(), double(tokens)));
  }
  if (tokens_out) *tokens_out = tokens;
  return loss_sum / double(std::max<int64_t>(1, tokens));
}

void Trainer::update_router_bias(bool apply) {
  std::vector<int64_t> load(progress_.router_bias.size(), 0);
  for (auto& c : chunks_) {
    const std::vector<int64_t> part = c->take_expert_load();
    for (size_t i = 0; i < load.size(); ++i) load[i] += part[i];
  }
  step_expert_load_.clear();
  if (!apply) return;
  if (balance_group_) {  // exact: integer counts (n_layer x E i64, a few KiB)
    const Tensor t = Tensor::empty(Shape{int64_t(load.size())}, DType::i64);
    std::copy(load.begin(), load.end(), t.data<int64_t>());
    balance_group_->all_reduce(t)->wait();
    std::copy_n(t.data<int64_t>(), load.size(), load.begin());
  }
  nn::move_router_bias(progress_.router_bias, load, cfg_.model.n_expert, cfg_.model.router_bias_update_rate);
  step_expert_load_ = std::move(load);
  for (auto& c : chunks_) c->set_router_bias(progress_.router_bias);
}

void Trainer::set_router_bias(const std::vector<float>& bias) {
  const size_t biases = size_t(cfg_.model.moe() ? cfg_.model.n_layer * cfg_.model.n_expert : 0);
  ZT_CHECK(bias.empty() || bias.size() == biases, "the checkpoint's state.progress.router_bias has ", bias.size(),
           " values, but this model has ", cfg_.model.n_layer, " layers x ", cfg_.model.n_expert,
           " experts; start from a checkpoint of the same [model] section");
  // Biases are model state: kept when saved, and started at zero when the
  // run balances but the checkpoint (from a run that did not) has none.
  progress_.router_bias = bias;
  if (bias.empty() && cfg_.model.router_bias_update_rate > 0) progress_.router_bias.assign(biases, 0.0f);
  for (auto& c : chunks_) c->set_router_bias(progress_.router_bias);
}

void Trainer::set_progress(const TrainProgress& p) {
  progress_ = p;
  set_router_bias(p.router_bias);
  if (!scaler_)
    progress_.loss_scale = {};
  else if (p.loss_scale.scale > 0)
    scaler_->check(p.loss_scale);
  else  // saved without loss scaling (or before it existed): start at the initial scale
    progress_.loss_scale = scaler_->initial();
}

std::vector<std::string> Trainer::samples(uint64_t seed, int64_t count) {
  ZT_CHECK(codec_ != nullptr, "sample: no tokenizer");
  std::vector<uint32_t> prompt =
      cfg_.sample.prompt.empty() ? std::vector<uint32_t>{codec_->eot_token} : codec_->encode(cfg_.sample.prompt);
  SamplingOptions opt;
  opt.max_new_tokens = cfg_.sample.tokens;
  opt.temperature = cfg_.sample.temperature;
  opt.top_k = cfg_.sample.top_k;
  opt.top_p = cfg_.sample.top_p;
  opt.seed = seed;
  opt.stop_token = int64_t(codec_->eot_token);
  // The samples are drawn together (KV caches of count sequences). Under
  // pipeline parallelism every rank of the pipeline runs its stages over
  // their caches for each token and gets the head stage's logits.
  std::vector<std::vector<uint32_t>> tokens;
  if (pipeline_) {
    std::vector<nn::KvCache> caches = pipeline_->make_kv_caches(count, kv_cache_positions(cfg_.model, prompt, opt));
    const DecodeFn decode = [&](const Tensor& t, bool restart) {
      if (restart)
        for (nn::KvCache& c : caches) c.clear();
      return pipeline_->last_logits(t, &caches);
    };
    tokens = generate_samples(decode, cfg_.model, prompt, opt, count);
  } else {
    tokens = generate_samples(model(), prompt, opt, count);
  }
  std::vector<std::string> texts;
  for (std::vector<uint32_t>& out : tokens) {
    if (cfg_.sample.prompt.empty()) out.erase(out.begin());
    if (!out.empty() && out.back() == codec_->eot_token) out.pop_back();
    texts.push_back(codec_->decode(out));
  }
  return texts;
}

namespace {

// Keeps the records of metrics.jsonl up to `step` (a resumed run rewrites
// what the interrupted run logged after its checkpoint).
void truncate_metrics(const std::filesystem::path& path, int64_t step) {
  std::ifstream in(path);
  if (!in.good()) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("step", int64_t(0)) <= step) kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

}  // namespace

TrainResult Trainer::run(int64_t stop_after) {
  namespace fs = std::filesystem;
  const fs::path run_dir(cfg_.train.run_dir);
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  ZT_CHECK(!ec, "cannot create run directory '", run_dir.string(), "': ", ec.message());
  const int64_t first_step = progress_.steps_done;  // > 0 after a restored checkpoint
  const bool resumed = first_step > 0;
  check_no_future_checkpoints(cfg_, first_step);
  // Only the main rank writes the run directory's files and talks; every
  // rank computes the same step metrics (losses and norms are reduced).
  std::ofstream log_file;
  std::unique_ptr<MetricsLog> metrics;
  if (main_rank_) {
    std::ofstream cfg_out(run_dir / "config.toml");
    ZT_CHECK(cfg_out.good(), "cannot write ", (run_dir / "config.toml").string());
    cfg_out << "# Resolved configuration of this run (every key, with the values in force).\n" << to_toml(cfg_);
    log_file.open(run_dir / "train.log", resumed ? std::ios::app : std::ios::trunc);
    if (resumed) truncate_metrics(run_dir / "metrics.jsonl", first_step);
    metrics = std::make_unique<MetricsLog>((run_dir / "metrics.jsonl").string(), resumed);
  }
  auto console = log;
  auto say = [&](const std::string& line) {
    if (!main_rank_) return;
    console(line);
    log_file << line << "\n";
    log_file.flush();
  };
  std::unique_ptr<TrainCheckpointer> checkpointer;
  if (cfg_.checkpoint.every > 0) checkpointer = std::make_unique<TrainCheckpointer>(cfg_);
  auto save = [&](int64_t step) {
    const std::string dir = checkpointer->save(*this);
    say((cfg_.checkpoint.async ? "checkpoint step " + std::to_string(step) + ": writing in the background to "
                               : "checkpoint step " + std::to_string(step) + ": saved to ") + dir);
  };
  if (tp_group())
    say("tensor parallel: " + std::to_string(tp_group()->size()) + " ranks" +
        (cfg_.parallel.sequence_parallel ? ", sequence parallel" : "") + "; this rank holds " +
        std::to_string(model().tp_shares().q_heads) + " query heads, " + std::to_string(model().tp_shares().ff) +
        " MLP columns, " + std::to_string(model().tp_shares().vocab_rows) + " vocabulary rows");
  if (pipeline_) {
    std::string stages;
    for (const auto& c : chunks_)
      stages += (stages.empty() ? "" : ", ") + std::string("blocks ") + std::to_string(c->part().first_layer) + "-" +
                std::to_string(c->part().last_layer - 1) + (c->part().embedding ? " + embeddings" : "") +
                (c->part().head ? " + head" : "");
    say("pipeline parallel: " + std::to_string(mesh_->pp().size()) + " stages x " +
        std::to_string(chunks_.size()) + " chunk(s), schedule " + cfg_.parallel.pp_schedule + ", " +
        std::to_string(cfg_.grad_accum_steps(data_ranks_)) + " micro-batches; rank 0 of the pipeline holds " + stages +
        " (each rank logs its own in metrics)");
  }
  if (cp_group())
    say("context parallel: " + std::to_string(cp_group()->size()) + " ranks, ring attention over zigzag chunks of " +
        std::to_string(cfg_.train.seq_len / (2 * cp_group()->size())) + " tokens (two per rank); gradients reduce over "
        "dp x cp");
  if (dp_->size() > 1)
    say("data parallel: " + std::to_string(dp_->size()) + " ranks" + (cp_group() ? " (dp x cp)" : "") + ", ZeRO stage " +
        std::to_string(dp_->zero_stage()) +
        (dp_->shard_size() != dp_->size() ? ", shards over groups of " + std::to_string(dp_->shard_size()) : "") +
        ", gradient buckets of " + format_mib(cfg_.parallel.bucket_mb) + " MiB");

  const nn::ModelConfig& mc = cfg_.model;
  char head[512];
  std::snprintf(head, sizeof head,
                "model %s (%s): %lld layers, d_model %lld, %lld heads (%lld kv), %.2fM parameters (%.2fM "
                "non-embedding), %s, recompute %s",
                cfg_.model_preset.empty() ? "custom" : cfg_.model_preset.c_str(), std::string(nn::arch_name(mc.arch)).c_str(),
                (long long)mc.n_layer, (long long)mc.d_model, (long long)mc.n_head, (long long)mc.n_kv_head,
                double(mc.total_params()) / 1e6, double(mc.non_embedding_params()) / 1e6, cfg_.train.dtype.c_str(),
                cfg_.train.recompute.c_str());
  say(head);
  if (mc.moe()) say(nn::moe_summary(mc) + "; MFU counts the active parameters of the products");
  std::snprintf(head, sizeof head,
                "batch: %lld sequences x %lld tokens = %lld tokens/step (micro-batch %lld, %lld accumulation steps); "
                "%lld steps; MFU peak %.1f GFLOP/s%s",
                (long long)cfg_.train.global_batch, (long long)cfg_.train.seq_len,
                (long long)(cfg_.train.global_batch * cfg_.train.seq_len), (long long)cfg_.train.micro_batch,
                (long long)cfg_.grad_accum_steps(dp_->size()), (long long)cfg_.train.steps, peak_gflops_,
                (" (" + peak_source_ + ")").c_str());
  say(head);
  say("memory plan (estimated): " + memory_plan_);
  say("run directory: " + run_dir.string());
  if (resumed)
    say("resuming after step " + std::to_string(first_step) + " (" + std::to_string(progress_.tokens_seen) +
        " tokens seen)");
  for (const std::string& note : start_notes) say(note);
  for (const auto& [key, step] : {std::pair<const char*, int64_t>{"trace_step", cfg_.metrics.trace_step},
                                  {"pipeline_trace_step", cfg_.metrics.pipeline_trace_step}})
    if (step > 0 && step <= first_step)
      say(std::string("note: metrics.") + key + " = " + std::to_string(step) + " was before this run resumed (after "
          "step " + std::to_string(first_step) + "): no trace is written; pick a later step");

  TrainResult result;
  result.steps = first_step;
  StepMetrics last;  // of the latest step run here
  // metrics.op_profile: the run's time per op, over the steps after the
  // first (warm-up: allocations, cuBLASLt plans) when there are several.
  ops::enable_op_profile(cfg_.metrics.op_profile);
  struct ProfileOff {
    ~ProfileOff() { ops::enable_op_profile(false); }
  } profile_off;
  std::vector<ops::OpTotal> op_run;
  int64_t op_steps = 0;
  double op_step_seconds = 0;
  const auto t_start = Clock::now();
  for (int64_t step = first_step; step < cfg_.train.steps; ++step) {
    StepMetrics m = train_step(step);
    m.elapsed_seconds = seconds_since(t_start);
    if (!m.op_totals.empty() && (step > first_step || cfg_.train.steps - first_step == 1)) {
      add_op_totals(op_run, m.op_totals);
      ++op_steps;
      op_step_seconds += m.step_seconds;
    }
    if (metrics) metrics->write_step(m);
    result.losses.push_back(m.loss);
    last = m;
    result.final_loss = m.loss;
    result.steps = m.step;
    if (m.step % cfg_.train.log_every == 0 || m.step == cfg_.train.steps || m.skipped) say(format_step_line(m));
    for (auto& hook : step_hooks) hook(m);
    const bool last = m.step == cfg_.train.steps;
    const bool stopping = stop_after > 0 && m.step >= stop_after && !last;
    if (checkpointer && (m.step % cfg_.checkpoint.every == 0 || last || stopping)) save(m.step);
    if (val_ && cfg_.train.eval_every > 0 && (m.step % cfg_.train.eval_every == 0 || last)) {
      int64_t val_tokens = 0;
      const double val = evaluate(&val_tokens);
      result.final_val_loss = val;
      std::vector<std::pair<std::string, double>> each;
      for (NamedBatchSource& s : val_each_) each.emplace_back(s.name, evaluate(*s.source));
      if (metrics) metrics->write_eval(m.step, val, val_tokens, each);
      char line[128];
      std::snprintf(line, sizeof line, "eval  step %lld | val loss %.4f (%lld tokens)", (long long)m.step, val,
                    (long long)val_tokens);
      std::string text = line;
      for (const auto& [name, loss] : each) {
        std::snprintf(line, sizeof line, "%.4f", loss);
        text += " | " + name + " " + line;
      }
      say(text);
    }
    if (codec_ && cfg_.sample.count > 0 &&
        ((cfg_.train.sample_every > 0 && m.step % cfg_.train.sample_every == 0) || last)) {
      dp_->hold_full_params(true);  // ZeRO-3: every rank gathers; then the main rank samples alone
      // Under tensor and pipeline parallelism every rank of the main rank's
      // model replica computes the same samples (each forward is a collective
      // of its tp and pp groups), and under expert parallelism every rank of
      // its ep group (whose experts the tokens visit); the main rank prints them.
      const bool main_ep = mesh_ && mesh_->ep().size() > 1 && [this] {
        const parallel::MeshCoord first = parallel::coord_of(mesh_->shape(), mesh_->ep().world_ranks().front());
        return first.dp == 0 && first.cp == 0;  // this rank's ep group holds the main replica's (dp, cp) place
      }();
      if (main_rank_ || main_ep || ((tp_group() || pipeline_) && mesh_->coord().dp == 0 && mesh_->coord().cp == 0))
        for (const std::string& text :
             samples(uint64_t(cfg_.train.seed) * 1000003u + uint64_t(m.step) * 131u, cfg_.sample.count))
          say("sample (step " + std::to_string(m.step) + "): " + text);
      dp_->hold_full_params(false);
    }
    if (stopping) {
      say("stopping after step " + std::to_string(m.step) + " as asked (--stop-after)" +
          (checkpointer ? "; continue with --resume" : "; checkpoint.every = 0, so nothing was saved"));
      break;
    }
  }
  if (checkpointer) checkpointer->wait();  // a background write must finish (and its error surface) before exit
  say("done: " + std::to_string(result.steps) + " steps in " + std::to_string(int(seconds_since(t_start))) +
      "s; run directory: " + run_dir.string());
  say("memory by category (this process; peaks over the run, evaluation and checkpoints included; planned: the "
      "pre-flight estimate of a training step):\n" +
      format_memory_against_plan(allocator_for(model().device()).stats(), rank_plan_));
  if (model().device().is_cuda()) {
    // What the allocator does not see: the CUDA context, cuBLAS's, cuDNN's
    // and NCCL's own buffers (NCCL connects its channels at their first use),
    // and other processes on the GPU. What came after the pre-flight check
    // (the libraries' kernels loaded at first use, NCCL's channels, another
    // process) is what its plan had no room for: the number to size a
    // reserve with.
    const TrainingMemory now = training_memory(model().device(), 1);
    const std::string since_plan =
        outside_at_plan_ < 0 ? ""
                             : "; " + format_gib(double(outside_at_plan_)) + " at the pre-flight check, so " +
                                   format_gib(double(now.outside - outside_at_plan_)) + " came after it";
    say(model().device().str() + " outside this process's allocator at the end: " + format_gib(double(now.outside)) +
        " (the CUDA context, cuBLAS's, cuDNN's and NCCL's own buffers, other processes" + since_plan +
        "); free: " + format_gib(double(now.free)) + " of " + format_gib(double(now.total)));
  }
  if (op_steps > 0)
    say("time per op, mean of " + std::to_string(op_steps) + " step(s)" +
        (model().device().is_cuda() ? " (GPU time from events)" : "") + ", this process:\n" +
        format_op_profile(op_run, op_steps, op_step_seconds));
#if ZT_WITH_CUDA
  if (model().device().is_cuda()) {
    std::string races;
    for (const std::string& line : cuda::kernel_race_lines()) races += "\n  " + line;
    if (!races.empty())
      say("kernels raced on this process's first calls of each shape (the fastest call of each; the kernels of a "
          "race write the same bits):" + races);
    // A model's products take their bias and residual inside cuBLASLt; a
    // prefill pass each means cuBLASLt refused that here (slower, same sums).
    if (const int64_t prefilled = cuda::prefilled_matmul_launches(); prefilled > 0)
      say("products whose bias or residual cuBLASLt did not take (a prefill pass of their own each): " +
          std::to_string(prefilled) + " launches");
  }
#endif
  if (dp_->size() > 1 && result.steps > first_step)
    say("highest peak of the last step: data-parallel rank " + std::to_string(last.max_peak_rank) + ", " +
        std::to_string(last.max_peak_memory.total_peak_bytes >> 20) + " MiB");
  return result;
}

}  // namespace zt::train
