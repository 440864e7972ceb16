// One dataset of a blend: a folder prepared by `zettatron prepare` and its
// weight (> 0; a blend's weights are normalised). The config names them
// (train::Config::data_parts) and the loader reads them (data/loader.h).
#pragma once

#include <string>

namespace zt::data {

struct BlendPart {
  std::string dir;
  double weight = 1.0;
};

}  // namespace zt::data
