// Row softmax (templates/softmax/softmax.cu).
#include "families.h"

namespace kiln::templates::detail {

void add_softmax_templates(std::vector<TemplateDef>& out) {
  TemplateDef d = builtin_def("softmax", "softmax", "softmax(scale * x) over rows, fp32 arithmetic",
                              "softmax/softmax.cu", "kiln_softmax");
  d.params = row_params({dtype_param("dtype", ParamRole::kProblem, {DType::kBF16, DType::kF16, DType::kF32}, "",
                                     "x and y dtype")});
  d.params.push_back(derived_param("row_threads", ParamKind::kInt, "threads per row"));
  d.derive = [](const Params& p) -> Result<Params> {
    int64_t rpb = get_int(p, "rows_per_block");
    return Params{{"row_threads", Value::integer(rpb > 0 ? get_int(p, "threads") / rpb : 0)}};
  };
  d.constraints = [](const Params& p, const DeviceLimits& l) { return row_constraints(p, l, 24); };
  d.problem_constraints = row_problem;
  d.geometry = row_geometry;
  out.push_back(std::move(d));
}

}  // namespace kiln::templates::detail
