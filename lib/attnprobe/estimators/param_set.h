#pragma once
// An estimator's parameters, declared once: a plain struct whose member initialisers are the
// defaults, and a ParamSet that binds each spec key to a member with its type, range or choices and a
// line of help. Everything else is derived from that one declaration — the spec parser's keys and
// checks, the canonical spec, `attnprobe list`, Python's estimators(), the error messages — and
// Spec → struct decoding (params_of<P> in registry.h), the same on every device.
//
//   struct YosoParams {
//     int m = 32;                      ///< number of hashes
//     LshKind hash = LshKind::kGauss;
//   };
//   ParamSet<YosoParams>()
//       .integer("m", &YosoParams::m, 1, 65536, "number of hashes (the samples knob)")
//       .choice("hash", &YosoParams::hash, {{"gauss", LshKind::kGauss}, {"hadamard", LshKind::kHadamard}}, "...")
//
// A member is named by a member pointer or, for nested fields, by a callable returning a reference
// (`[](FavorppParams& p) -> auto& { return p.gerf.variant; }`). check() adds a rule across keys
// (e.g. a < 1/8 unless a=opt): it throws UsageError, so a bad combination is refused when the spec is
// parsed, like a bad value.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnprobe/common/text.h"

namespace attnprobe {

enum class ParamKind { kInt, kReal, kChoice, kText };

/// One key of a spec, as the parser, `list` and Python see it.
struct ParamDef {
  std::string name;
  ParamKind kind = ParamKind::kInt;
  std::string default_value;         ///< as it would be written in a spec
  double min = 0, max = 0;           ///< inclusive range for kInt/kReal
  std::vector<std::string> choices;  ///< for kChoice; for kReal, words accepted besides a number (e.g. "opt")
  std::string help;                  ///< one line
};

/// What a key accepts, for people: "integer 1..65536", "real 0..100", "opt or real -1e+06..0.125",
/// "gauss|hadamard" (spec errors, `list`).
std::string param_domain(const ParamDef& param);

template <class P>
class ParamSet {
  template <class Access>
  using Member = std::remove_cvref_t<std::invoke_result_t<Access, P&>>;

 public:
  /// An integer key bound to an integral member, or to a bool (a 0/1 key: 1 is true).
  template <class Access>
  ParamSet&& integer(std::string key, Access access, int64_t min, int64_t max, std::string help) && {
    using T = Member<Access>;
    static_assert(std::is_integral_v<T>, "integer() binds an integral or bool member");
    const int64_t initial = static_cast<int64_t>(std::invoke(access, defaults_));
    add({std::move(key),
         ParamKind::kInt,
         std::to_string(initial),
         static_cast<double>(min),
         static_cast<double>(max),
         {},
         std::move(help)},
        [access](P& p, const std::string& text) {
          int64_t value = 0;
          parse_int(text, value);  // validated by the parser before it reaches here
          std::invoke(access, p) = static_cast<T>(value);
        });
    return std::move(*this);
  }

  /// A real key bound to a double member.
  template <class Access>
  ParamSet&& real(std::string key, Access access, double min, double max, std::string help) && {
    static_assert(std::is_same_v<Member<Access>, double>, "real() binds a double member");
    add({std::move(key), ParamKind::kReal, format_real(std::invoke(access, defaults_)), min, max, {}, std::move(help)},
        [access](P& p, const std::string& text) { parse_real(text, std::invoke(access, p)); });
    return std::move(*this);
  }

  /// A real key that also takes one word (e.g. `a=opt`): the word sets `is_word` true, a number sets
  /// it false and `value` to the number.
  template <class WordAccess, class ValueAccess>
  ParamSet&& real_or_word(std::string key, std::string word, WordAccess is_word, ValueAccess value, double min,
                          double max, std::string help) && {
    const std::string initial = std::invoke(is_word, defaults_) ? word : format_real(std::invoke(value, defaults_));
    add({std::move(key), ParamKind::kReal, initial, min, max, {word}, std::move(help)},
        [word, is_word, value](P& p, const std::string& text) {
          std::invoke(is_word, p) = text == word;
          if (text != word) parse_real(text, std::invoke(value, p));
        });
    return std::move(*this);
  }

  /// A key with named values, each bound to a value of the member's type (an enum, a bool, ...), in
  /// the order `list` shows them and variants() walks them.
  template <class Access>
  ParamSet&& choice(std::string key, Access access, std::vector<std::pair<std::string, Member<Access>>> options,
                    std::string help) && {
    std::vector<std::string> words;
    std::string initial;
    for (const auto& [word, value] : options) {
      words.push_back(word);
      if (value == std::invoke(access, defaults_) && initial.empty()) initial = word;
    }
    add({std::move(key), ParamKind::kChoice, initial, 0, 0, std::move(words), std::move(help)},
        [access, options = std::move(options)](P& p, const std::string& text) {
          for (const auto& [word, value] : options)
            if (word == text) std::invoke(access, p) = value;
        });
    return std::move(*this);
  }

  /// A text key bound to a std::string member (a file path): any text without `,;()` or spaces, "" by default;
  /// variants() leave it at its default.
  template <class Access>
  ParamSet&& text(std::string key, Access access, std::string help) && {
    static_assert(std::is_same_v<Member<Access>, std::string>, "text() binds a std::string member");
    add({std::move(key), ParamKind::kText, std::invoke(access, defaults_), 0, 0, {}, std::move(help)},
        [access](P& p, const std::string& text) { std::invoke(access, p) = text; });
    return std::move(*this);
  }

  /// A rule across keys, run on every decoded setting: throws UsageError to refuse it.
  ParamSet&& check(std::function<void(const P&)> rule) && {
    rules_.push_back(std::move(rule));
    return std::move(*this);
  }

  /// The keys in declaration (canonical) order.
  const std::vector<ParamDef>& defs() const { return defs_; }

  /// The struct for canonical values given in declaration order (a parsed Spec's), rules checked.
  P decode(const std::vector<std::string>& canonical_values) const {
    P p{};
    for (size_t i = 0; i < setters_.size(); ++i) setters_[i](p, canonical_values[i]);
    for (const auto& rule : rules_) rule(p);
    return p;
  }

 private:
  void add(ParamDef def, std::function<void(P&, const std::string&)> setter) {
    defs_.push_back(std::move(def));
    setters_.push_back(std::move(setter));
  }

  P defaults_{};
  std::vector<ParamDef> defs_;
  std::vector<std::function<void(P&, const std::string&)>> setters_;
  std::vector<std::function<void(const P&)>> rules_;
};

/// The parameters of an estimator that takes none.
struct NoParams {};

}  // namespace attnprobe
