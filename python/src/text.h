// strf("{} of {}", a, b): the one text helper the extension needs. Its own rather than fmt's, because an
// installed libkiln.so keeps fmt inside (and the GPU machine has no fmt to build against).
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

namespace kiln::py {

namespace detail {
inline void format_to(std::ostringstream& out, std::string_view f) {
  for (size_t i = 0; i < f.size(); ++i) {
    if ((f[i] == '{' || f[i] == '}') && i + 1 < f.size() && f[i + 1] == f[i]) ++i;
    out << f[i];
  }
}
template <class A, class... Rest>
void format_to(std::ostringstream& out, std::string_view f, const A& a, const Rest&... rest) {
  for (size_t i = 0; i < f.size(); ++i) {
    if ((f[i] == '{' || f[i] == '}') && i + 1 < f.size() && f[i + 1] == f[i]) {
      out << f[i++];
    } else if (f[i] == '{' && i + 1 < f.size() && f[i + 1] == '}') {
      if constexpr (std::is_same_v<A, signed char> || std::is_same_v<A, unsigned char>) {
        out << int(a);  // a byte-sized number, not a character
      } else {
        out << a;
      }
      return format_to(out, f.substr(i + 2), rest...);
    } else {
      out << f[i];
    }
  }
}
}  // namespace detail

/// Replaces each "{}" with the next argument (as std::ostream writes it); "{{" and "}}" are braces.
template <class... A>
std::string strf(std::string_view f, const A&... a) {
  std::ostringstream out;
  detail::format_to(out, f, a...);
  return out.str();
}

}  // namespace kiln::py
