// RemoteUrl: parsing and printing. Every message here is built from the redacted URL, so a password in a
// malformed URL never reaches a log.
#include <fmt/format.h>

#include <charconv>

#include "kiln/cache/remote.h"

namespace kiln::cache {
namespace {

// The URL with the password of its user information (between "://" and the last '@') replaced by ***.
std::string redact(std::string_view url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string_view::npos) return std::string(url.substr(0, 200));
  const size_t start = scheme + 3;
  const size_t at = url.rfind('@');
  if (at == std::string_view::npos || at < start) return std::string(url.substr(0, 200));
  std::string_view userinfo = url.substr(start, at - start);
  const size_t colon = userinfo.find(':');
  std::string out(url.substr(0, start));
  out += colon == std::string_view::npos ? "***" : std::string(userinfo.substr(0, colon)) + ":***";
  out += url.substr(at);
  return out;
}

Status bad(std::string_view url, std::string_view why) {
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("remote cache URL '{}': {} (expected redis://[user:password@]host:port[/db] or "
                                "unix:///path/to/socket[?db=N])",
                                redact(url), why));
}

Result<std::string> percent_decode(std::string_view s, std::string_view url, std::string_view what) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    int v = 0;
    if (i + 2 >= s.size()) return bad(url, fmt::format("a bad %-escape in the {}", what));
    auto [p, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
    if (ec != std::errc() || p != s.data() + i + 3) return bad(url, fmt::format("a bad %-escape in the {}", what));
    out += char(v);
    i += 2;
  }
  return out;
}

Result<int> parse_int(std::string_view s, int lo, int hi, std::string_view url, std::string_view what) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) {
    return bad(url, fmt::format("the {} '{}' is not a number from {} to {}", what, s, lo, hi));
  }
  return v;
}

}  // namespace

Result<RemoteUrl> RemoteUrl::parse(std::string_view url) {
  RemoteUrl out;
  if (url.empty()) return bad(url, "it is empty");
  for (unsigned char c : url) {
    if (c <= 0x20 || c >= 0x7f) return bad(url, "it holds a space or a control or non-ASCII character");
  }
  if (url.starts_with("unix://")) {
    std::string_view rest = url.substr(7);
    const size_t q = rest.find('?');
    std::string_view path = rest.substr(0, q);
    if (path.empty() || path[0] != '/') return bad(url, "a unix socket needs an absolute path (unix:///run/redis.sock)");
    KILN_ASSIGN_OR_RETURN(out.socket, percent_decode(path, url, "path"));
    if (q != std::string_view::npos) {
      std::string_view query = rest.substr(q + 1);
      if (!query.starts_with("db=")) return bad(url, "the only query a unix URL takes is ?db=N");
      KILN_ASSIGN_OR_RETURN(out.db, parse_int(query.substr(3), 0, 1 << 20, url, "database"));
    }
    return out;
  }
  if (url.starts_with("rediss://")) return bad(url, "TLS (rediss://) is not supported; use a private network or a unix socket");
  if (!url.starts_with("redis://")) return bad(url, "the scheme must be redis:// or unix://");
  std::string_view rest = url.substr(8);
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) {
      KILN_ASSIGN_OR_RETURN(out.db, parse_int(db, 0, 1 << 20, url, "database"));
    }
  }
  const size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) return bad(url, "user information needs a password (user:password@ or :password@)");
    KILN_ASSIGN_OR_RETURN(out.user, percent_decode(userinfo.substr(0, colon), url, "user"));
    KILN_ASSIGN_OR_RETURN(out.password, percent_decode(userinfo.substr(colon + 1), url, "password"));
    if (out.password.empty()) return bad(url, "the password is empty");
  }
  std::string_view port;
  if (authority.starts_with('[')) {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad(url, "an IPv6 host misses its ']'");
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad(url, "text after the IPv6 host");
      port = after.substr(1);
      if (port.empty()) return bad(url, "the port is empty");
    }
  } else {
    const size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return bad(url, "the port is empty");
    }
  }
  if (out.host.empty()) return bad(url, "the host is empty");
  if (!port.empty()) {
    KILN_ASSIGN_OR_RETURN(out.port, parse_int(port, 1, 65535, url, "port"));
  }
  return out;
}

std::string RemoteUrl::display() const {
  if (!socket.empty()) return fmt::format("unix://{}?db={}", socket, db);
  std::string auth;
  if (!password.empty()) auth = user + ":***@";
  const bool v6 = host.find(':') != std::string::npos;
  return fmt::format("redis://{}{}{}{}:{}/{}", auth, v6 ? "[" : "", host, v6 ? "]" : "", port, db);
}

}  // namespace kiln::cache
