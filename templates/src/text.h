// The parsed form of a template text (see the syntax in kiln/templates/template.h). Internal.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/status.h"
#include "kiln/templates/template.h"

namespace kiln::templates::detail {

struct Node {
  enum Kind { kLiteral, kSubst, kIf } kind = kLiteral;
  std::string text;          // kLiteral
  std::string name;          // kSubst, kIf
  std::string attr;          // kSubst: "" or the attribute after '.'
  bool negate = false;       // kIf
  int line = 0;              // 1-based line of the directive
  std::vector<Node> then_nodes, else_nodes;
};

struct ParsedText {
  std::string what;          // for errors: "template 'rmsnorm' (norms/rmsnorm.cu)"
  std::vector<Node> nodes;
};

Result<std::shared_ptr<const ParsedText>> parse_text(std::string_view text, std::string what);

/// Checks every placeholder and ${if} against declared parameters (kind, attribute).
Status check_names(const ParsedText& t, const std::vector<ParamSpec>& specs);

/// Renders with `values`; an error names a placeholder without a value or of the wrong kind.
Result<std::string> render_parsed(const ParsedText& t, const Params& values);

/// Collects the parameter names referred to.
void collect_names(const std::vector<Node>& nodes, std::vector<std::string>& out);

}  // namespace kiln::templates::detail
