// `zettatron train CONFIG [--set section.key=value]...`
#include <iostream>

#include "cli/commands.h"
#include "train/data_source.h"
#include "train/model_file.h"
#include "train/trainer.h"

namespace zt::cli {

Command add_train_command(CLI::App& app) {
  struct Opts {
    std::string config;
    std::vector<std::string> overrides;
  };
  auto opts = std::make_shared<Opts>();
  Command c;
  c.app = app.add_subcommand("train", "Train a model from a TOML config");
  c.app->add_option("config", opts->config, "TOML config (see configs/)")->required()->check(CLI::ExistingFile);
  c.app->add_option("--set", opts->overrides, "Override a config value: section.key=value (repeatable)");
  c.run = [opts] {
    const train::Config cfg = train::load_config(opts->config, opts->overrides);
    train::TrainingData data = train::open_training_data(cfg);
    train::Trainer trainer(cfg, std::move(data.train), std::move(data.val), std::move(data.codec));
    trainer.run();
    const std::string path = train::save_model_file(trainer.model(), cfg);
    std::cout << "final weights: " << path << "\n"
              << "try: zettatron generate --checkpoint " << cfg.train.run_dir << " --prompt \"...\"" << std::endl;
    return 0;
  };
  return c;
}

}  // namespace zt::cli
