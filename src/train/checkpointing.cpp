#include "train/checkpointing.h"

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "core/error.h"
#include "ops/device.h"
#include "ops/elementwise.h"

namespace zt::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kShardFile = "shard-00000.safetensors";  // the one rank's file

// Calls f(name, master, exp_avg, exp_avg_sq, param) for every parameter:
// views (on the model's device) of the optimizer's flat f32 buffers and of
// the compute-dtype weights.
template <typename F>
void for_each_param(const Trainer& t, F&& f) {
  const auto sets = const_cast<Trainer&>(t).model().param_sets();
  const optim::AdamW& opt = const_cast<Trainer&>(t).optimizer();
  for (size_t si = 0; si < sets.size(); ++si) {
    const nn::ParamSet& s = *sets[si];
    for (size_t i = 0; i < s.size(); ++i) {
      const Shape& shape = s.spec(i).shape;
      const int64_t off = s.offset(i);
      f(s.spec(i).name, opt.master(si).flat_view(off, shape), opt.exp_avg(si).flat_view(off, shape),
        opt.exp_avg_sq(si).flat_view(off, shape), s.param(i));
    }
  }
}

json progress_json(const TrainProgress& p) {
  return {{"steps_done", p.steps_done},
          {"tokens_seen", p.tokens_seen},
          {"bad_steps", p.bad_steps},
          {"last_good_loss", p.last_good_loss},
          {"last_good_step", p.last_good_step}};
}

TrainProgress progress_from(const json& j, const std::string& where) {
  try {
    TrainProgress p;
    p.steps_done = j.at("steps_done").get<int64_t>();
    p.tokens_seen = j.at("tokens_seen").get<int64_t>();
    p.bad_steps = j.at("bad_steps").get<int64_t>();
    p.last_good_loss = j.at("last_good_loss").get<double>();
    p.last_good_step = j.at("last_good_step").get<int64_t>();
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

// Reads checkpoint tensor `name` into the device view `dst` (f32), through a
// host tensor of the stored dtype.
void load_into(const ckpt::Checkpoint& ck, const std::string& name, const Tensor& dst) {
  const ckpt::TensorEntry& e = ck.entry(name);
  Tensor host = ck.read(name);
  if (e.dtype != dst.dtype()) {
    Tensor cast = Tensor::empty(host.shape(), dst.dtype());
    ops::cast(cast, host);
    host = cast;
  }
  ops::copy(dst, host);
}

// Every model tensor present with the model's shape; one error listing all
// the differences otherwise.
void check_model_tensors(const Trainer& t, const ckpt::Checkpoint& ck, bool with_optimizer) {
  std::string problems;
  int count = 0;
  std::set<std::string> expected;
  for_each_param(t, [&](const std::string& name, const Tensor& master, const Tensor&, const Tensor&, const Tensor&) {
    std::vector<std::string> keys{"model." + name};
    expected.insert("model." + name);
    if (with_optimizer) {
      keys.push_back("optim.exp_avg." + name);
      keys.push_back("optim.exp_avg_sq." + name);
    }
    for (const std::string& k : keys) {
      if (!ck.contains(k)) {
        problems += "\n  " + k + ": missing";
        ++count;
      } else if (ck.entry(k).shape != master.shape()) {
        problems += "\n  " + k + ": checkpoint " + ck.entry(k).shape.str() + ", model " + master.shape().str();
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

}  // namespace

TrainCheckpointer::TrainCheckpointer(const Config& cfg) : cfg_(cfg) {}

TrainCheckpointer::~TrainCheckpointer() = default;  // background_ waits

void TrainCheckpointer::wait() { background_.wait(); }

std::string TrainCheckpointer::save(const Trainer& t) {
  const TrainProgress& p = t.progress();
  const bool async = cfg_.checkpoint.async;
  // Everything is captured now, at the step boundary: later steps change the
  // trainer's tensors while a background write is still going.
  std::vector<ckpt::SliceToWrite> slices;
  for_each_param(t, [&](const std::string& name, const Tensor& master, const Tensor& m, const Tensor& v, const Tensor&) {
    slices.push_back({"model." + name, master.shape(), {}, host_tensor(master, async)});
    slices.push_back({"optim.exp_avg." + name, m.shape(), {}, host_tensor(m, async)});
    slices.push_back({"optim.exp_avg_sq." + name, v.shape(), {}, host_tensor(v, async)});
  });
  const optim::LrSchedule sched = cfg_.lr_schedule();
  json state = {
      {"progress", progress_json(p)},
      {"optimizer", {{"steps_taken", const_cast<Trainer&>(t).optimizer().steps_taken()}}},
      {"data", const_cast<Trainer&>(t).train_data().state()},
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
  auto job = [root, step, tokens, config_text, policy, slices = std::move(slices), state = std::move(state)] {
    ckpt::CheckpointWriter w(root, step);
    w.write_file(kShardFile, slices);
    ckpt::Manifest& m = w.manifest();
    m.tokens_seen = tokens;
    m.config = config_text;
    m.layout = {{"world_size", 1}, {"dp", 1}, {"tp", 1}, {"pp", 1}, {"cp", 1}, {"ep", 1}, {"zero_stage", 0}};
    m.state = state;
    w.commit();
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
  for_each_param(t, [&](const std::string& name, const Tensor& master, const Tensor& m, const Tensor& v,
                        const Tensor& param) {
    load_into(ck, "model." + name, master);
    if (param.dtype() != DType::f32) ops::cast(param, master);  // the weights are the master's rounding
    load_into(ck, "optim.exp_avg." + name, m);
    load_into(ck, "optim.exp_avg_sq." + name, v);
  });
  t.optimizer().set_steps_taken(state["optimizer"].value("steps_taken", int64_t(0)));
  const TrainProgress p = progress_from(state["progress"], where);
  ZT_CHECK(p.steps_done == ck.manifest().step, where, ": state.progress.steps_done = ", p.steps_done,
           " but the checkpoint is for step ", ck.manifest().step);
  ZT_CHECK(p.steps_done <= t.config().train.steps, "the checkpoint ", ck.dir(), " is at step ", p.steps_done,
           ", beyond train.steps = ", t.config().train.steps, "; raise train.steps to train further");
  t.train_data().restore(state["data"]);
  t.set_progress(p);
  return ck.dir();
}

std::string init_weights_from_checkpoint(Trainer& t, const std::string& path) {
  const ckpt::Checkpoint ck = ckpt::Checkpoint::open(path);
  check_model_tensors(t, ck, false);
  for_each_param(t, [&](const std::string& name, const Tensor& master, const Tensor&, const Tensor&,
                        const Tensor& param) {
    load_into(ck, "model." + name, master);
    if (param.dtype() != DType::f32) ops::cast(param, master);
  });
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
  w->write_file(kShardFile, slices);
  w->manifest().config = to_toml(cfg);
  w->manifest().layout = {{"world_size", 1}, {"dp", 1}, {"tp", 1}, {"pp", 1}, {"cp", 1}, {"ep", 1}, {"zero_stage", 0}};
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
    if (name.rfind("model.", 0) != 0) continue;
    Tensor t = ck.read(name);
    if (t.dtype() != DType::f32) {
      Tensor f32 = Tensor::empty(t.shape(), DType::f32);
      ops::cast(f32, t);
      t = f32;
    }
    out.tensors.emplace_back(name.substr(6), t);
  }
  ZT_CHECK(!out.tensors.empty(), "the checkpoint ", ck.dir(), " holds no model weights (no model.* tensors)");
  return out;
}

}  // namespace zt::train
