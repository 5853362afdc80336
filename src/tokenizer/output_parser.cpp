// Incremental output parser (see output_parser.h). Each state looks for the markers that end
// it; a buffer suffix that is a prefix of such a marker is held back until more text arrives.
#include "tokenizer/output_parser.h"

#include <fmt/format.h>

namespace ds::tok {
namespace {

constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kCallsOpen = "<｜DSML｜tool_calls>";
constexpr std::string_view kCallsClose = "</｜DSML｜tool_calls>";
constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke";
constexpr std::string_view kInvokeClose = "</｜DSML｜invoke>";
constexpr std::string_view kParamOpen = "<｜DSML｜parameter";
constexpr std::string_view kParamClose = "</｜DSML｜parameter>";

// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  size_t max = std::min(s.size(), marker.size() - 1);
  for (size_t k = max; k > 0; --k)
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Reads `key="value"` at the start of `s` (after spaces); advances `s` past it.
bool read_attr(std::string_view* s, std::string_view key, std::string* value) {
  std::string_view t = *s;
  while (!t.empty() && is_space(t.front())) t.remove_prefix(1);
  if (t.substr(0, key.size()) != key) return false;
  t.remove_prefix(key.size());
  if (t.substr(0, 2) != "=\"") return false;
  t.remove_prefix(2);
  size_t q = t.find('"');
  if (q == std::string_view::npos) return false;
  *value = std::string(t.substr(0, q));
  t.remove_prefix(q + 1);
  *s = t;
  return true;
}

}  // namespace

OutputParser::OutputParser(ThinkingMode mode)
    : state_(mode == ThinkingMode::kThinking ? State::kReasoning : State::kContent) {}

bool OutputParser::parse_invoke(std::string_view block, ParsedToolCall* out,
                                std::string* err) const {
  // block = everything after "<｜DSML｜invoke" up to (excluding) "</｜DSML｜invoke>".
  std::string name;
  if (!read_attr(&block, "name", &name) || block.empty() || block.front() != '>') {
    *err = "tool call: invoke tag without name=\"...\">";
    return false;
  }
  block.remove_prefix(1);
  std::vector<std::pair<std::string, std::string>> params;  // name -> JSON value text
  while (true) {
    size_t p = block.find(kParamOpen);
    if (p == std::string_view::npos) {
      if (!trim(block).empty()) {
        *err = "tool call: unexpected text inside invoke";
        return false;
      }
      break;
    }
    if (!trim(block.substr(0, p)).empty()) {
      *err = "tool call: unexpected text before a parameter";
      return false;
    }
    block.remove_prefix(p + kParamOpen.size());
    std::string pname, is_str;
    if (!read_attr(&block, "name", &pname) || !read_attr(&block, "string", &is_str) ||
        block.empty() || block.front() != '>' || (is_str != "true" && is_str != "false")) {
      *err = "tool call: malformed parameter tag";
      return false;
    }
    block.remove_prefix(1);
    size_t e = block.find(kParamClose);
    if (e == std::string_view::npos) {
      *err = "tool call: parameter without its closing tag";
      return false;
    }
    std::string value(block.substr(0, e));
    block.remove_prefix(e + kParamClose.size());
    for (const auto& [k, v] : params) {
      if (k == pname) {
        *err = fmt::format("tool call: duplicate parameter \"{}\"", pname);
        return false;
      }
    }
    std::string json_value;
    if (is_str == "true") {
      json_value = python_json_dumps(OrderedJson(value));
    } else {
      // string="false" values are JSON already; anything that is not valid JSON is kept as a
      // string so that the arguments stay a valid JSON object. A NUL byte is never valid JSON,
      // but the parser stops reading at one and would accept `1\0junk` (found by fuzzing).
      auto parsed = OrderedJson::parse(value, nullptr, false);
      const bool is_json = !parsed.is_discarded() && value.find('\0') == std::string::npos;
      json_value = is_json ? value : python_json_dumps(OrderedJson(value));
    }
    params.emplace_back(std::move(pname), std::move(json_value));
  }
  // Same spelling as the reference decoder: {"k": v, "k2": v2}.
  std::string args = "{";
  for (size_t i = 0; i < params.size(); ++i) {
    if (i > 0) args += ", ";
    args += python_json_dumps(OrderedJson(params[i].first));
    args += ": ";
    args += params[i].second;
  }
  args += "}";
  out->name = std::move(name);
  out->arguments = std::move(args);
  return true;
}

void OutputParser::step(OutputDelta* d, bool final) {
  while (true) {
    switch (state_) {
      case State::kReasoning: {
        size_t p = buf_.find(kThinkEnd);
        if (p != std::string::npos) {
          d->reasoning.append(buf_, 0, p);
          buf_.erase(0, p + kThinkEnd.size());
          state_ = State::kContent;
          continue;
        }
        size_t keep = final ? 0 : partial_suffix(buf_, kThinkEnd);
        d->reasoning.append(buf_, 0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::kContent: {
        size_t p = buf_.find(kCallsOpen);
        if (p != std::string::npos) {
          // The reference writes "\n\n" before the block; it is not part of the content.
          size_t end = p;
          for (int i = 0; i < 2 && end > 0 && buf_[end - 1] == '\n'; ++i) --end;
          d->content.append(buf_, 0, end);
          buf_.erase(0, p + kCallsOpen.size());
          state_ = State::kToolCalls;
          saw_tool_calls_ = true;
          continue;
        }
        size_t keep = 0;
        if (!final) {
          keep = partial_suffix(buf_, kCallsOpen);
          // Trailing newlines may be the "\n\n" before a block: hold them back too.
          size_t nl = 0;
          while (nl < 2 && nl + keep < buf_.size() && buf_[buf_.size() - keep - nl - 1] == '\n')
            ++nl;
          keep += nl;
        }
        d->content.append(buf_, 0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::kToolCalls: {
        size_t close = buf_.find(kCallsClose);
        size_t inv = buf_.find(kInvokeOpen);
        if (inv != std::string::npos && (close == std::string::npos || inv < close)) {
          size_t inv_end = buf_.find(kInvokeClose, inv);
          if (inv_end == std::string::npos) break;  // wait for the rest of the call
          if (!trim(std::string_view(buf_).substr(0, inv)).empty()) {
            d->error = "tool call: unexpected text between calls";
            break;
          }
          std::string_view block = std::string_view(buf_).substr(
              inv + kInvokeOpen.size(), inv_end - inv - kInvokeOpen.size());
          ParsedToolCall call;
          std::string err;
          if (!parse_invoke(block, &call, &err)) {
            d->error = err;
            break;
          }
          d->tool_calls.push_back(std::move(call));
          buf_.erase(0, inv_end + kInvokeClose.size());
          continue;
        }
        if (close != std::string::npos) {
          if (!trim(std::string_view(buf_).substr(0, close)).empty()) {
            d->error = "tool call: unexpected text in the tool_calls block";
            break;
          }
          buf_.erase(0, close + kCallsClose.size());
          state_ = State::kAfterToolCalls;
          continue;
        }
        if (!final) return;
        d->error = "tool call: the tool_calls block is not closed";
        break;
      }
      case State::kRaw:
        d->content += buf_;
        buf_.clear();
        return;
      case State::kAfterToolCalls: {
        // The reference expects EOS right after the block. Whitespace there is dropped; other
        // text is parsed as content again (leading whitespace removed).
        size_t first = buf_.find_first_not_of(" \n\r\t");
        if (first == std::string::npos) {
          if (final) buf_.clear();
          return;
        }
        buf_.erase(0, first);
        state_ = State::kContent;
        continue;
      }
    }
    // Malformed or unfinished tool-call block: return the rest as content, report once.
    if (state_ == State::kToolCalls && (!d->error.empty() || final)) {
      if (d->error.empty()) d->error = "tool call: the tool_calls block is not closed";
      if (reported_error_) d->error.clear();
      reported_error_ = true;
      d->content += std::string(kCallsOpen) + buf_;
      buf_.clear();
      // No more markup parsing after a malformed block: the rest is text, so the result does not
      // depend on where the stream was split when the error was found.
      state_ = State::kRaw;
      return;
    }
    return;
  }
}

OutputDelta OutputParser::push(std::string_view text) {
  OutputDelta d;
  buf_.append(text);
  step(&d, false);
  return d;
}

OutputDelta OutputParser::finish() {
  OutputDelta d;
  step(&d, true);
  return d;
}

}  // namespace ds::tok
