// The template text syntax: parsing, name checking and rendering. Kept small on purpose (see template.h).
#include "text.h"

#include <algorithm>

#include <fmt/format.h>

namespace kiln::templates::detail {
namespace {

bool is_ident(std::string_view s) {
  if (s.empty() || !(std::islower(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Status syntax_error(const std::string& what, int line, const std::string& msg) {
  return make_error(ErrorCode::kInvalidArgument, fmt::format("{}, line {}: {}", what, line, msg));
}

// The attributes each kind has (see template.h).
bool has_attr(ParamKind k, std::string_view attr) {
  if (attr.empty()) return true;
  switch (k) {
    case ParamKind::kDType: return attr == "name" || attr == "bytes" || attr == "is_f32";
    case ParamKind::kLayout: return attr == "name" || attr == "row" || attr == "col";
    case ParamKind::kCode: return attr == "tag";
    default: return false;
  }
}

}  // namespace

Result<std::shared_ptr<const ParsedText>> parse_text(std::string_view text, std::string what) {
  auto out = std::make_shared<ParsedText>();
  out->what = std::move(what);
  // A stack of open node lists: the top is where nodes go. Each ${if} pushes its then-list; ${else} swaps to
  // its else-list; ${endif} pops.
  struct Open {
    Node* node;       // the kIf node (null for the root)
    bool in_else;
    int line;
  };
  std::vector<Open> stack{{nullptr, false, 0}};
  auto target = [&]() -> std::vector<Node>& {
    const Open& o = stack.back();
    if (!o.node) return out->nodes;
    return o.in_else ? o.node->else_nodes : o.node->then_nodes;
  };
  std::string literal;
  int line = 1;
  auto flush = [&] {
    if (literal.empty()) return;
    Node n;
    n.kind = Node::kLiteral;
    n.text = std::move(literal);
    literal.clear();
    target().push_back(std::move(n));
  };
  size_t i = 0;
  while (i < text.size()) {
    char c = text[i];
    if (c != '$' || i + 1 >= text.size() || (text[i + 1] != '$' && text[i + 1] != '{')) {
      if (c == '\n') ++line;
      literal.push_back(c);
      ++i;
      continue;
    }
    if (text[i + 1] == '$') {
      literal.push_back('$');
      i += 2;
      continue;
    }
    const size_t start = i;
    size_t close = text.find_first_of("}\n", i + 2);
    if (close == std::string_view::npos || text[close] != '}') {
      return syntax_error(out->what, line, "'${' without a closing '}' on the same line");
    }
    std::string_view body = trim(text.substr(i + 2, close - i - 2));
    i = close + 1;
    bool directive = false;
    // A directive alone on its line (only blanks before it, a newline or the end after it) takes its whole
    // line with it, so blocks leave no blank lines; inside a line of text it leaves the text around it alone.
    const bool is_directive = body == "else" || body == "endif" || body == "if" || body.starts_with("if ");
    bool standalone = false;
    if (is_directive && (i == text.size() || text[i] == '\n')) {
      size_t nl = start == 0 ? std::string_view::npos : text.rfind('\n', start - 1);
      size_t line_start = nl == std::string_view::npos ? 0 : nl + 1;
      standalone = text.substr(line_start, start - line_start).find_first_not_of(" \t") == std::string_view::npos;
      if (standalone) {
        while (!literal.empty() && (literal.back() == ' ' || literal.back() == '\t')) literal.pop_back();
      }
    }
    if (body.starts_with("if ") || body == "if") {
      std::string_view cond = trim(body.substr(2));
      bool negate = false;
      if (!cond.empty() && cond.front() == '!') {
        negate = true;
        cond = trim(cond.substr(1));
      }
      if (!is_ident(cond)) return syntax_error(out->what, line, fmt::format("'${{{}}}': not a parameter name", body));
      flush();
      Node n;
      n.kind = Node::kIf;
      n.name = std::string(cond);
      n.negate = negate;
      n.line = line;
      target().push_back(std::move(n));
      stack.push_back({&target().back(), false, line});
      directive = true;
    } else if (body == "else") {
      if (stack.size() == 1) return syntax_error(out->what, line, "'${else}' outside '${if}'");
      if (stack.back().in_else) return syntax_error(out->what, line, "a second '${else}' in one '${if}'");
      flush();
      stack.back().in_else = true;
      directive = true;
    } else if (body == "endif") {
      if (stack.size() == 1) return syntax_error(out->what, line, "'${endif}' without '${if}'");
      flush();
      stack.pop_back();
      directive = true;
    } else {
      std::string_view name = body, attr;
      if (auto dot = body.find('.'); dot != std::string_view::npos) {
        name = body.substr(0, dot);
        attr = body.substr(dot + 1);
        if (!is_ident(attr)) return syntax_error(out->what, line, fmt::format("'${{{}}}': bad attribute", body));
      }
      if (!is_ident(name)) {
        return syntax_error(out->what, line, fmt::format("'${{{}}}': not a parameter name ([a-z_][a-z0-9_]*)", body));
      }
      flush();
      Node n;
      n.kind = Node::kSubst;
      n.name = std::string(name);
      n.attr = std::string(attr);
      n.line = line;
      target().push_back(std::move(n));
    }
    if (directive && standalone && i < text.size()) {
      ++i;  // the newline
      ++line;
    }
  }
  if (stack.size() > 1) return syntax_error(out->what, stack.back().line, "'${if}' without '${endif}'");
  flush();
  return std::shared_ptr<const ParsedText>(std::move(out));
}

void collect_names(const std::vector<Node>& nodes, std::vector<std::string>& out) {
  for (const Node& n : nodes) {
    if (n.kind == Node::kLiteral) continue;
    out.push_back(n.name);
    collect_names(n.then_nodes, out);
    collect_names(n.else_nodes, out);
  }
}

namespace {

Status check_nodes(const std::string& what, const std::vector<Node>& nodes, const std::vector<ParamSpec>& specs) {
  for (const Node& n : nodes) {
    if (n.kind == Node::kLiteral) continue;
    auto it = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == n.name; });
    if (it == specs.end()) {
      return syntax_error(what, n.line, fmt::format("placeholder '{}' is not a declared parameter", n.name));
    }
    if (n.kind == Node::kIf && it->kind != ParamKind::kBool) {
      return syntax_error(what, n.line,
                          fmt::format("'${{if {}}}' needs a bool parameter; '{}' is {}", n.name, n.name, kind_name(it->kind)));
    }
    if (n.kind == Node::kSubst && !has_attr(it->kind, n.attr)) {
      return syntax_error(what, n.line,
                          fmt::format("'.{}' is not an attribute of {} parameter '{}'", n.attr, kind_name(it->kind), n.name));
    }
    KILN_RETURN_IF_ERROR(check_nodes(what, n.then_nodes, specs));
    KILN_RETURN_IF_ERROR(check_nodes(what, n.else_nodes, specs));
  }
  return Status();
}

Status render_nodes(const ParsedText& t, const std::vector<Node>& nodes, const Params& values, std::string& out) {
  for (const Node& n : nodes) {
    if (n.kind == Node::kLiteral) {
      out += n.text;
      continue;
    }
    auto it = values.find(n.name);
    if (it == values.end()) {
      return syntax_error(t.what, n.line, fmt::format("placeholder '{}' has no value", n.name));
    }
    const Value& v = it->second;
    if (n.kind == Node::kIf) {
      if (v.kind() != ParamKind::kBool) {
        return syntax_error(t.what, n.line,
                            fmt::format("'${{if {}}}' needs a bool; '{}' is {}", n.name, n.name, kind_name(v.kind())));
      }
      bool take = v.as_bool() != n.negate;
      KILN_RETURN_IF_ERROR(render_nodes(t, take ? n.then_nodes : n.else_nodes, values, out));
      continue;
    }
    if (!has_attr(v.kind(), n.attr)) {
      return syntax_error(t.what, n.line,
                          fmt::format("'.{}' is not an attribute of {} parameter '{}'", n.attr, kind_name(v.kind()), n.name));
    }
    switch (v.kind()) {
      case ParamKind::kInt: out += std::to_string(v.as_int()); break;
      case ParamKind::kBool: out += v.as_bool() ? "true" : "false"; break;
      case ParamKind::kDType:
        if (n.attr.empty()) out += dtype_cpp(v.as_dtype());
        else if (n.attr == "name") out += dtype_name(v.as_dtype());
        else if (n.attr == "bytes") out += std::to_string(dtype_bytes(v.as_dtype()));
        else out += v.as_dtype() == DType::kF32 ? "true" : "false";
        break;
      case ParamKind::kLayout: {
        bool row = v.as_layout() == Layout::kRowMajor;
        if (n.attr.empty()) out += row ? "0" : "1";
        else if (n.attr == "name") out += layout_name(v.as_layout());
        else if (n.attr == "row") out += row ? "true" : "false";
        else out += row ? "false" : "true";
        break;
      }
      case ParamKind::kEnum: out += v.as_enum(); break;
      case ParamKind::kCode: out += n.attr.empty() ? v.as_code() : v.code_tag(); break;
    }
  }
  return Status();
}

}  // namespace

Status check_names(const ParsedText& t, const std::vector<ParamSpec>& specs) {
  return check_nodes(t.what, t.nodes, specs);
}

Result<std::string> render_parsed(const ParsedText& t, const Params& values) {
  std::string out;
  KILN_RETURN_IF_ERROR(render_nodes(t, t.nodes, values, out));
  return out;
}

}  // namespace kiln::templates::detail
