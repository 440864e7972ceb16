// `zettatron train CONFIG [--set section.key=value]... [--resume [PATH] | --init-from CKPT] [--stop-after STEP]`
#include <iostream>

#include "cli/commands.h"
#include "cli/errors.h"
#include "comm/nccl/nccl_group.h"
#include "comm/process_group.h"
#include "comm/staged_group.h"
#include "core/error.h"
#include "ops/device.h"
#include "parallel/mesh.h"
#include "train/checkpointing.h"
#include "train/data_source.h"
#include "train/gpu_placement.h"
#include "train/model_file.h"
#include "train/trainer.h"

namespace zt::cli {

Command add_train_command(CLI::App& app) {
  struct Opts {
    std::string config;
    std::vector<std::string> overrides;
    std::string resume;  // "" with --resume given: the run's latest checkpoint
    std::string init_from;
    int64_t stop_after = 0;
  };
  auto opts = std::make_shared<Opts>();
  Command c;
  c.app = app.add_subcommand("train", "Train a model from a TOML config");
  c.app->add_option("config", opts->config, "TOML config (see configs/)")->required()->check(CLI::ExistingFile);
  c.app->add_option("--set", opts->overrides, "Override a config value: section.key=value (repeatable)");
  auto* resume = c.app
                     ->add_option("--resume", opts->resume,
                                  "Continue a run from a checkpoint: its latest (no value) or PATH (a checkpoint, "
                                  "a checkpoints directory or a run directory)")
                     ->expected(0, 1);
  auto* init = c.app->add_option("--init-from", opts->init_from,
                                 "Start from a checkpoint's weights (fine-tuning, or a model imported with "
                                 "`zettatron convert --from-hf`); optimizer and data start fresh");
  resume->excludes(init);
  c.app->add_option("--stop-after", opts->stop_after,
                    "Stop after this step, saving a checkpoint there (to end inside a job's time limit; continue "
                    "with --resume)")
      ->check(CLI::NonNegativeNumber);
  c.run = [opts, resume] {
    train::Config cfg = train::load_config(opts->config, opts->overrides);
    // Every check below is pure and the same on every rank: a bad setting
    // fails everywhere, with one message, before the first collective.
    std::string resume_from;
    if (resume->count() > 0) resume_from = train::resume_path(cfg, opts->resume);
    // A GPU's tuning switches too: a typo would otherwise surface at its
    // kernel's first call, after the model is built and the data opened.
    // (Read from the environment alone: no CUDA call before MPI starts.)
    if (cfg.train.device != "cpu") ops::read_device_environment();
    ZT_CHECK(opts->stop_after == 0 || cfg.checkpoint.every > 0,
             "--stop-after needs checkpoints to continue from: set checkpoint.every (e.g. --set checkpoint.every=",
             opts->stop_after, ")");
    // The groups and what holds them live outside the try: an error in a job
    // of several processes ends it while they do (end_job_on_error).
    std::unique_ptr<comm::ProcessGroup> gpu_world;  // outlives the mesh and trainer
    std::shared_ptr<parallel::Mesh> mesh;
    std::unique_ptr<train::Trainer> trainer;
    try {
      // Host collectives over MPI (or solo). GPU tensors over NCCL when asked, or
      // by default when several processes train on GPUs; with comm_backend = mpi
      // they are staged through host memory and MPI (slow; processes may share
      // a GPU). Either group also serves host tensors, so the mesh's groups are
      // all split from it.
      const bool nccl_asked = cfg.parallel.comm_backend == "nccl";
      comm::ProcessGroup& world =
          comm::world({nccl_asked ? "auto" : cfg.parallel.comm_backend, cfg.parallel.comm_timeout});
      // A launcher that binds one GPU per process: each process's GPU named.
      train::GpuPlacement placed = train::place_on_gpus(std::move(cfg), world);
      cfg = std::move(placed.config);
      if (!placed.note.empty() && world.rank() == 0) std::cout << placed.note << std::endl;
      const bool gpu = cfg.device(false).is_cuda();
      if (nccl_asked || (cfg.parallel.comm_backend == "auto" && gpu && world.size() > 1))
        gpu_world = comm::make_nccl_group(world.split(0, world.rank(), "world"), cfg.device(true), "world");
      else if (gpu && world.size() > 1)
        gpu_world = comm::make_host_staged_group(world.split(0, world.rank(), "world"), ops::copy);
      comm::ProcessGroup& mesh_world = gpu_world ? *gpu_world : world;
      const parallel::MeshShape shape = parallel::resolve_mesh_shape(
          {cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.cp, cfg.parallel.ep}, mesh_world.size());
      ZT_CHECK(cfg.train.global_batch % (cfg.train.micro_batch * shape.dp) == 0, "train.global_batch = ",
               cfg.train.global_batch, " is not divisible by micro_batch x dp = ", cfg.train.micro_batch, " x ",
               shape.dp, "; each of the ", shape.dp, " data-parallel ranks runs global_batch / dp sequences");
      ZT_CHECK(cfg.parallel.shard_group == 0 || shape.dp % cfg.parallel.shard_group == 0, "parallel.shard_group = ",
               cfg.parallel.shard_group, " must divide dp = ", shape.dp);
      mesh = std::make_shared<parallel::Mesh>(shape, mesh_world);
      train::TrainingData data = train::open_training_data(cfg, int(mesh->coord().dp), int(shape.dp));
      trainer = std::make_unique<train::Trainer>(cfg, std::move(data.train), std::move(data.val), std::move(data.codec),
                                                 mesh);
      trainer->set_dataset_validation(std::move(data.val_each));
      const bool main_rank = trainer->is_main_rank();
      if (!resume_from.empty()) {
        const std::string dir = train::restore_checkpoint(*trainer, resume_from);
        if (main_rank)
          std::cout << "restored " << dir << " (step " << trainer->progress().steps_done << ")" << std::endl;
      }
      if (!opts->init_from.empty()) {
        const std::string dir = train::init_weights_from_checkpoint(*trainer, opts->init_from);
        if (main_rank) std::cout << "initial weights from " << dir << std::endl;
      }
      const train::TrainResult r = trainer->run(opts->stop_after);
      if (r.steps < cfg.train.steps) return 0;  // stopped early: the checkpoint is the result
      trainer->data_parallel().hold_full_params(true);  // ZeRO-3: the whole model, for the final file
      std::vector<const nn::Transformer*> chunks;
      for (const auto& c : trainer->chunks()) chunks.push_back(c.get());
      // A collective over tp (slices) and pp (stages): every rank takes part.
      const std::string path = train::save_model_file(chunks, trainer->pp_group(), cfg, main_rank,
                                                       trainer->progress().router_bias, trainer->progress().steps_done);
      if (!main_rank) return 0;
      std::cout << "final weights: " << path << "\n"
                << "try: zettatron generate --checkpoint " << cfg.train.run_dir << " --prompt \"...\"" << std::endl;
      return 0;
    } catch (...) {
      end_job_on_error();
      throw;
    }
  };
  return c;
}

}  // namespace zt::cli
