// The environment policy (common/env.h) for Python: the settings in effect, for `zcoll info`,
// and typed reads of a variable, so Python never parses a ZCOLL_* variable itself.
#include "bindings.h"
#include "common/env.h"

namespace py = pybind11;

namespace zcoll::bindings {

void bind_env(py::module_& m) {
  m.def("env_settings", [] {
    py::list out;
    for (const env::Setting& s : env::settings()) {
      py::dict d;
      d["name"] = s.name;
      d["value"] = s.value;
      d["source"] = s.source;
      d["valid"] = s.valid;
      d["help"] = s.help;
      out.append(d);
    }
    return out;
  });
  m.def(
      "env_get",
      [](const std::string& name) -> py::object {
        const env::Var var = env::find(name);
        switch (env::kind_of(var)) {
          case env::Kind::kBool: return py::bool_(env::get_bool(var));
          case env::Kind::kInt:
          case env::Kind::kBytes: return py::int_(env::get_int(var));
          case env::Kind::kChoice:
          case env::Kind::kString: break;
        }
        return py::str(env::get_choice(var));
      },
      py::arg("name"), "The value of a ZCOLL_* variable in effect (typed); ValueError on a bad value.");
  m.def("env_normalise", py::overload_cast<const std::string&, const std::string&>(&env::normalise),
        py::arg("name"), py::arg("value"));
}

}  // namespace zcoll::bindings
