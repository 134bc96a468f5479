// An enum's names as one table that both directions read: naming a value and parsing a name cannot drift
// apart, and adding an enumerator is one row.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace kiln {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
};

/// The name `table` gives `value`; `unknown` for a value it does not list (a cast from a bad integer).
template <class E, std::size_t N>
constexpr std::string_view name_in(const std::array<EnumName<E>, N>& table, E value, std::string_view unknown) {
  for (const auto& row : table) {
    if (row.value == value) return row.name;
  }
  return unknown;
}

/// The value named `name` in `table`; nullopt where none is.
template <class E, std::size_t N>
constexpr std::optional<E> value_in(const std::array<EnumName<E>, N>& table, std::string_view name) {
  for (const auto& row : table) {
    if (row.name == name) return row.value;
  }
  return std::nullopt;
}

}  // namespace kiln
