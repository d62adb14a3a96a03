// The host functions stage.h declares for the registry: selecting stages.
#include <string>

#include "error.h"
#include "stage.h"

namespace flashstep {

std::vector<const Stage*> select_stages(std::string_view selector) {
  std::vector<const Stage*> out;
  const std::vector<Stage>& stages = all_stages();
  for (const Stage& s : stages) {
    if (selector == "all" || s.name == selector) out.push_back(&s);
  }
  if (out.empty()) {
    // A number: "3" or "03" selects every stage whose name starts "03_".
    std::string prefix(selector);
    if (prefix.size() == 1) prefix = "0" + prefix;
    for (const Stage& s : stages) {
      if (s.name.substr(0, prefix.size() + 1) == prefix + "_") out.push_back(&s);
    }
  }
  if (out.empty()) {
    std::string names;
    for (const Stage& s : stages) names += (names.empty() ? "" : ", ") + std::string(s.name);
    throw Error("unknown stage '" + std::string(selector) + "' (known: " + names + ", all)");
  }
  return out;
}

}  // namespace flashstep
