#include "train/checkpointing.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "nn/tensor_parallel.h"
#include "core/error.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "parallel/data_parallel.h"

namespace zt::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The file data-parallel rank `rank` writes its part of a checkpoint into.
std::string shard_file(int64_t rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "shard-%05lld.safetensors", (long long)rank);
  return buf;
}

// The parallel layout a checkpoint records (informational: loading reads
// global tensors, so any layout loads any checkpoint).
json layout_json(int64_t dp, int64_t tp, bool sequence_parallel, int64_t pp, int64_t cp, int64_t zero_stage,
                 int64_t shard_group) {
  return {{"world_size", dp * tp * pp * cp}, {"dp", dp}, {"tp", tp}, {"sequence_parallel", sequence_parallel},
          {"pp", pp}, {"cp", cp}, {"ep", 1}, {"zero_stage", zero_stage}, {"shard_group", shard_group}};
}

// The global names of every parameter of the model (all pipeline stages).
std::set<std::string> model_tensor_names(const nn::ModelConfig& cfg) {
  const nn::TpShares whole = nn::tp_shares(cfg, 1, 0);
  std::set<std::string> names;
  for (const nn::ParamSpec& s : nn::embedding_specs(cfg, whole)) names.insert(s.name);
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    for (const nn::ParamSpec& s : nn::block_specs(cfg, whole, size_t(i))) names.insert(s.name);
  for (const nn::ParamSpec& s : nn::head_specs(cfg, whole)) names.insert(s.name);
  return names;
}

// Every parameter tensor: its spec (global name, local shape, pieces of the
// global tensor), its set's index, its offset in the set's flat buffer and
// its set (whose full weights ZeRO-3 may have freed).
template <typename F>
void for_each_tensor(const Trainer& t, F&& f) {
  const auto sets = t.param_sets();  // every pipeline chunk's
  for (size_t si = 0; si < sets.size(); ++si)
    for (size_t i = 0; i < sets[si]->size(); ++i) f(sets[si]->spec(i), si, sets[si]->offset(i), *sets[si], i);
}

json progress_json(const TrainProgress& p) {
  return {{"steps_done", p.steps_done},
          {"tokens_seen", p.tokens_seen},
          {"bad_steps", p.bad_steps},
          {"last_good_loss", p.last_good_loss},
          {"last_good_step", p.last_good_step},
          {"loss_scale", p.loss_scale.scale},
          {"loss_scale_good_steps", p.loss_scale.good_steps},
          {"overflow_steps", p.overflow_steps},
          {"router_bias", p.router_bias}};
}

TrainProgress progress_from(const json& j, const std::string& where) {
  try {
    TrainProgress p;
    p.steps_done = j.at("steps_done").get<int64_t>();
    p.tokens_seen = j.at("tokens_seen").get<int64_t>();
    p.bad_steps = j.at("bad_steps").get<int64_t>();
    p.last_good_loss = j.at("last_good_loss").get<double>();
    p.last_good_step = j.at("last_good_step").get<int64_t>();
    // Checkpoints written before loss scaling existed: the defaults.
    p.loss_scale.scale = j.value("loss_scale", 0.0);
    p.loss_scale.good_steps = j.value("loss_scale_good_steps", int64_t(0));
    p.overflow_steps = j.value("overflow_steps", int64_t(0));
    p.router_bias = j.value("router_bias", std::vector<float>{});  // written before balancing biases: none
    return p;
  } catch (const json::exception& e) {
    ZT_FAIL(where, ": state.progress is incomplete: ", e.what());
  }
}

// The host tensor to write for a device view: the view itself when it is
// on the host and may be written synchronously, else a copy.
Tensor host_tensor(const Tensor& t, bool copy) {
  if (t.device().is_cpu() && !copy) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype(), Device::cpu(), MemCategory::checkpoint);
  ops::copy(h, t);
  return h;
}

// `host` as f32 (a no-op for f32).
Tensor as_f32(const Tensor& host) {
  if (host.dtype() == DType::f32) return host;
  Tensor cast = Tensor::empty(host.shape(), DType::f32);
  ops::cast(cast, host);
  return cast;
}

// Checkpoint tensor `name` as an f32 host tensor.
Tensor read_f32(const ckpt::Checkpoint& ck, const std::string& name) { return as_f32(ck.read(name)); }

// Elements [lo, hi) of this rank's tensor of `spec` (flattened), f32, from
// the checkpoint's global tensor `key`: read box by box, so a rank loads only
// its shard (and its tensor-parallel slice); elements of no global tensor
// (vocabulary padding rows) are 0.
Tensor read_flat_f32(const ckpt::Checkpoint& ck, const std::string& key, const nn::ParamSpec& spec, int64_t lo,
                     int64_t hi) {
  const DType stored = ck.entry(key).dtype;
  Tensor out = Tensor::empty(Shape{hi - lo}, stored);
  ops::fill(out, 0.0);
  int64_t at = 0;
  for (const auto& [start, extent] : ckpt::flat_range_boxes(spec.shape, lo, hi)) {
    // Each box is a contiguous run of the range; its global boxes are parts of it.
    for (const nn::GlobalBox& g : nn::to_global_boxes(spec, start, extent, false))
      ck.read(key, out.flat_view(at + g.offset, g.extent), g.start);
    at += extent.numel();
  }
  return as_f32(out);
}

// The weights of every tensor (whole, on every rank), and the part of the
// master weights and (with_state) moments that this rank's optimizer shard
// holds. The checkpoint holds global tensors, so any dp size and ZeRO stage
// can load any checkpoint.
void load_weights_and_state(Trainer& t, const ckpt::Checkpoint& ck, bool with_state) {
  const optim::AdamW& opt = t.optimizer();
  // The weights in compute dtype are the master's rounding (as the optimizer's
  // last step rounded them: stochastic rounding redraws the same bits).
  auto rounded = [&](const Tensor& w, DType dtype, size_t si, int64_t offset) {
    return dtype == DType::f32 ? w : opt.rounded_weights(si, offset, w, dtype);
  };
  for_each_tensor(t, [&](const nn::ParamSpec& spec, size_t si, int64_t off, const nn::ParamSet& set, size_t index) {
    const std::string& name = spec.name;
    const int64_t n = spec.shape.numel();
    // This rank's whole tensor (its tensor-parallel slice), on every rank that
    // keeps full weights (not ZeRO-3).
    if (set.has_params())
      ops::copy(set.param(index),
                rounded(read_flat_f32(ck, "model." + name, spec, 0, n), set.dtype(), si, off).view(spec.shape));
    const optim::OptimShard& sh = opt.shard(si);
    const int64_t lo = std::max(off, sh.begin), hi = std::min(off + n, sh.end);
    if (hi <= lo) return;
    // This rank's shard of the master weights (and of the ZeRO-3 weights) and moments.
    auto mine = [&](const Tensor& state) { return state.flat_view(lo - sh.begin, Shape{hi - lo}); };
    auto part = [&](const std::string& key) { return read_flat_f32(ck, key, spec, lo - off, hi - off); };
    const Tensor w = part("model." + name);
    ops::copy(mine(opt.master(si)), w);
    ops::copy(mine(sh.param), rounded(w, set.dtype(), si, lo));
    if (with_state) {
      ops::copy(mine(opt.exp_avg(si)), part("optim.exp_avg." + name));
      ops::copy(mine(opt.exp_avg_sq(si)), part("optim.exp_avg_sq." + name));
    }
  });
}

// Every model tensor present with the model's shape; one error listing all
// the differences otherwise.
void check_model_tensors(const Trainer& t, const ckpt::Checkpoint& ck, bool with_optimizer) {
  std::string problems;
  int count = 0;
  std::set<std::string> expected;  // the whole model's (a pipeline rank holds some)
  for (const std::string& n : model_tensor_names(t.config().model)) expected.insert("model." + n);
  for_each_tensor(t, [&](const nn::ParamSpec& spec, size_t, int64_t, const nn::ParamSet&, size_t) {
    const std::string& name = spec.name;
    const Shape& shape = spec.global();
    std::vector<std::string> keys{"model." + name};
    if (with_optimizer) {
      keys.push_back("optim.exp_avg." + name);
      keys.push_back("optim.exp_avg_sq." + name);
    }
    for (const std::string& k : keys) {
      if (!ck.contains(k)) {
        problems += "\n  " + k + ": missing";
        ++count;
      } else if (ck.entry(k).shape != shape) {
        problems += "\n  " + k + ": checkpoint " + ck.entry(k).shape.str() + ", model " + shape.str();
        ++count;
      } else if (!dtype_is_float(ck.entry(k).dtype)) {
        problems += "\n  " + k + ": stored as " + std::string(dtype_name(ck.entry(k).dtype)) + ", not a float type";
        ++count;
      }
    }
  });
  for (const auto& [name, e] : ck.manifest().tensors)
    if (name.rfind("model.", 0) == 0 && !expected.count(name)) {
      problems += "\n  " + name + ": in the checkpoint " + e.shape.str() + ", not in the model";
      ++count;
    }
  ZT_CHECK(problems.empty(), "the checkpoint ", ck.dir(), " does not fit the configured model (", count,
           " tensor(s)):", problems,
           "\n(the [model] section must describe the model that was saved; its config is in the checkpoint's "
           "manifest.json)");
}

// This rank's part of every tensor: the boxes of master weights and moments
// that its optimizer shard holds (under ZeRO-0 the main data-parallel rank
// holds everything and the replicas write nothing; expert parallelism's
// experts are written by the first of the ranks holding them). Copies when the write is
// asynchronous or the state lives on a device.
std::vector<ckpt::SliceToWrite> own_slices(Trainer& t, bool copy) {
  std::vector<ckpt::SliceToWrite> out;
  const parallel::DataParallel& dp = t.data_parallel();
  const optim::AdamW& opt = t.optimizer();
  for_each_tensor(t, [&](const nn::ParamSpec& spec, size_t si, int64_t off, const nn::ParamSet&, size_t) {
    if (!dp.writes_checkpoint_part(si)) return;  // per set: expert parallelism's experts have replicas of their own
    const std::string& name = spec.name;
    const optim::OptimShard& sh = opt.shard(si);
    const int64_t lo = std::max(off, sh.begin), hi = std::min(off + spec.shape.numel(), sh.end);
    if (hi <= lo) return;
    int64_t at = lo - sh.begin;  // into the shard's state, advancing box by box
    for (const auto& [start, extent] : ckpt::flat_range_boxes(spec.shape, lo - off, hi - off)) {
      // The boxes of the global tensor this local box holds (tensor
      // parallelism: slices of it; a replicated piece is written by its owner).
      for (const nn::GlobalBox& g : nn::to_global_boxes(spec, start, extent, true)) {
        auto box = [&](const Tensor& state) { return host_tensor(state.flat_view(at + g.offset, g.extent), copy); };
        out.push_back({"model." + name, spec.global(), g.start, box(opt.master(si))});
        out.push_back({"optim.exp_avg." + name, spec.global(), g.start, box(opt.exp_avg(si))});
        out.push_back({"optim.exp_avg_sq." + name, spec.global(), g.start, box(opt.exp_avg_sq(si))});
      }
      at += extent.numel();
    }
  });
  return out;
}

// Every rank's JSON text, on every rank.
std::vector<json> all_gather_json(comm::ProcessGroup& g, const json& mine) {
  std::vector<json> out;
  for (const std::string& text : comm::all_gather_strings(g, mine.dump())) out.push_back(json::parse(text));
  return out;
}

}  // namespace

TrainCheckpointer::TrainCheckpointer(const Config& cfg) : cfg_(cfg) {}

TrainCheckpointer::~TrainCheckpointer() = default;  // background_ waits

void TrainCheckpointer::wait() { background_.wait(); }

std::string TrainCheckpointer::save(Trainer& t) {
  const TrainProgress& p = t.progress();
  const bool async = cfg_.checkpoint.async;
  const bool main = t.is_main_rank();
  // Everything is captured now, at the step boundary: later steps change the
  // trainer's tensors while a background write is still going.
  std::vector<ckpt::SliceToWrite> slices = own_slices(t, async || !t.model().device().is_cpu());
  const optim::LrSchedule sched = cfg_.lr_schedule();
  json state = {
      {"progress", progress_json(p)},
      {"optimizer", {{"steps_taken", t.optimizer().steps_taken()}}},
      {"data", t.train_data().state()},  // the same on every rank (rows are taken in lockstep)
      {"rng", {{"seed", cfg_.train.seed}}},
      {"lr_schedule",
       {{"kind", std::string(optim::lr_schedule_name(sched.kind))}, {"lr", sched.lr}, {"min_lr", sched.min_lr},
        {"warmup_steps", sched.warmup_steps}, {"total_steps", sched.total_steps}, {"decay_steps", sched.decay_steps},
        {"lr_at_next_step", sched.at(p.steps_done)}}},
  };
  const std::string root = cfg_.checkpoint_dir();
  const std::string config_text = to_toml(cfg_);
  const ckpt::RetentionPolicy policy{cfg_.checkpoint.keep_last, cfg_.checkpoint.keep_every};
  const int64_t step = p.steps_done, tokens = p.tokens_seen;
  const std::string dir = (fs::path(root) / ckpt::checkpoint_dir_name(step)).string();
  const parallel::DataParallel& dp = t.data_parallel();
  const nn::TensorParallel& tp = t.model().tensor_parallel();
  const int64_t pp = t.pp_group() ? t.pp_group()->size() : 1;
  // The gradient group is dp x cp under context parallelism: the layout names them apart.
  const int64_t cp = t.cp_group() ? t.cp_group()->size() : 1;
  const json layout =
      layout_json(dp.size() / cp, tp.size(), tp.sequence_parallel, pp, cp, dp.zero_stage(), dp.shard_size());
  const std::string file = shard_file(t.world_rank());
  // Its own comm thread: a background save never reorders training's collectives.
  comm::ProcessGroup* group = &t.checkpoint_group();
  auto job = [=, slices = std::move(slices), state = std::move(state)] {
    // The main rank stages the directory, every rank writes its file into
    // it, the main rank merges the ranks' parts of the manifest and commits.
    std::unique_ptr<ckpt::CheckpointWriter> w;
    if (main) w = std::make_unique<ckpt::CheckpointWriter>(root, step);
    group->barrier()->wait();
    if (!main) w = ckpt::CheckpointWriter::join(root, step);
    if (!slices.empty()) w->write_file(file, slices);
    const std::vector<json> parts = all_gather_json(*group, w->manifest().part_json());
    if (!main) return;
    ckpt::Manifest& m = w->manifest();
    for (size_t r = 1; r < parts.size(); ++r) m.merge_part(parts[r], "checkpoint part of rank " + std::to_string(r));
    m.tokens_seen = tokens;
    m.config = config_text;
    m.layout = layout;
    m.state = state;
    w->commit();
    ckpt::prune_checkpoints(root, policy);
  };
  if (async) {
    background_.submit(std::move(job));
  } else {
    background_.wait();
    job();
  }
  return dir;
}

std::string restore_checkpoint(Trainer& t, const std::string& path) {
  const ckpt::Checkpoint ck = ckpt::Checkpoint::open(path);
  const std::string where = ck.dir() + "/manifest.json";
  const json& state = ck.manifest().state;
  ZT_CHECK(state.contains("progress") && state.contains("optimizer") && state.contains("data"), where,
           " holds no training state (progress, optimizer, data): it is a weights-only checkpoint (e.g. imported "
           "with `zettatron convert --from-hf`); start from it with --init-from instead of --resume");
  check_model_tensors(t, ck, true);
  // Steps first: the weights are rounded from the master as that step rounded them.
  t.optimizer().set_steps_taken(state["optimizer"].value("steps_taken", int64_t(0)));
  load_weights_and_state(t, ck, true);
  const TrainProgress p = progress_from(state["progress"], where);
  ZT_CHECK(p.steps_done == ck.manifest().step, where, ": state.progress.steps_done = ", p.steps_done,
           " but the checkpoint is for step ", ck.manifest().step);
  ZT_CHECK(p.steps_done <= t.config().train.steps, "the checkpoint ", ck.dir(), " is at step ", p.steps_done,
           ", beyond train.steps = ", t.config().train.steps, "; raise train.steps to train further");
  t.train_data().restore(state["data"]);
  t.set_progress(p);
  // The settings changed since the checkpoint's run, said with the run's header.
  std::string note;
  try {
    for (const std::string& c : changed_settings(parse_saved_config(ck.manifest().config, where + " (config)"),
                                                 t.config()))
      note += "\n  " + c;
    if (!note.empty()) note = "settings changed since the checkpoint's run:" + note;
  } catch (const Error& e) {  // a config this version cannot read: resuming needs only the weights and state
    note = std::string("settings since the checkpoint's run not compared: ") + e.what();
  }
  if (!note.empty()) t.start_notes.push_back(note);
  return ck.dir();
}

std::string init_weights_from_checkpoint(Trainer& t, const std::string& path) {
  const ckpt::Checkpoint ck = ckpt::Checkpoint::open(path);
  check_model_tensors(t, ck, false);
  load_weights_and_state(t, ck, false);
  t.set_router_bias(saved_router_bias(ck.manifest().state));  // model state beside the weights
  return ck.dir();
}

std::string resume_path(const Config& cfg, const std::string& explicit_path) {
  if (!explicit_path.empty()) return ckpt::resolve_checkpoint_path(explicit_path);
  const std::string root = cfg.checkpoint_dir();
  const auto latest = ckpt::latest_checkpoint(root);
  ZT_CHECK(latest.has_value(), "--resume: no checkpoint to resume from in ", root,
           " (no `latest`: no save has completed there); pass --resume PATH, or drop --resume to start fresh");
  return *latest;
}

void check_no_future_checkpoints(const Config& cfg, int64_t first_step) {
  if (cfg.checkpoint.every <= 0) return;
  for (int64_t s : ckpt::list_checkpoints(cfg.checkpoint_dir()))
    if (s > first_step && (s % cfg.checkpoint.every == 0 || s == cfg.train.steps))
      ZT_FAIL("the checkpoint ", cfg.checkpoint_dir(), "/", ckpt::checkpoint_dir_name(s),
              " exists, and this run (from step ", first_step, ") would save over it; resume from the newest "
              "checkpoint (--resume), or move the later ones away, or use another checkpoint.dir");
}

void write_model_checkpoint(const std::string& dir, const Config& cfg,
                            const std::vector<std::pair<std::string, Tensor>>& tensors, const json& state) {
  auto w = ckpt::CheckpointWriter::standalone(dir, 0);
  std::vector<ckpt::SliceToWrite> slices;
  for (const auto& [name, t] : tensors) {
    Tensor host = t;
    if (t.dtype() != DType::f32 || !t.device().is_cpu()) {
      Tensor f32 = Tensor::empty(t.shape(), DType::f32, t.device());
      ops::cast(f32, t);
      host = ops::to_device(f32, Device::cpu(), MemCategory::checkpoint);
    }
    slices.push_back({"model." + name, host.shape(), {}, host});
  }
  w->write_file(shard_file(0), slices);
  w->manifest().config = to_toml(cfg);
  w->manifest().layout = layout_json(1, 1, false, 1, 1, 0, 1);
  w->manifest().state = state;
  w->commit();
}

ModelCheckpoint read_model_checkpoint(const std::string& path) {
  const ckpt::Checkpoint ck = ckpt::Checkpoint::open(path);
  ModelCheckpoint out;
  out.dir = ck.dir();
  out.config = parse_saved_config(ck.manifest().config, ck.dir() + "/manifest.json (config)");
  out.state = ck.manifest().state;
  for (const auto& [name, e] : ck.manifest().tensors) {
    if (name.rfind("model.", 0) == 0) out.tensors.emplace_back(name.substr(6), read_f32(ck, name));
  }
  ZT_CHECK(!out.tensors.empty(), "the checkpoint ", ck.dir(), " holds no model weights (no model.* tensors)");
  return out;
}

std::vector<float> saved_router_bias(const json& state) {
  if (!state.contains("progress")) return {};
  return state["progress"].value("router_bias", std::vector<float>{});
}

}  // namespace zt::train
