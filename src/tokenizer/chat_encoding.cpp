// DeepSeek-V4 chat encoding (see chat_encoding.h). The steps follow the reference encoder:
// merge tool messages into user turns, order tool results by call order, drop earlier reasoning
// (thinking mode, no tools), then render each message and the transition after it.
#include "tokenizer/chat_encoding.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace ds::tok {
namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kDsml = "｜DSML｜";

// The wording below is part of the model's training format (reference encoder constants); it
// has to match byte for byte, so it is restated here rather than paraphrased.
constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

constexpr std::string_view kResponseFormatPrefix =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// Tools block; @D@ = ｜DSML｜, @TS@ = <think>, @TE@ = </think>, @SCHEMAS@ = one JSON line per tool.
constexpr std::string_view kToolsTemplate =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<@D@tool_calls>\" block like the following:\n\n"
    "<@D@tool_calls>\n"
    "<@D@invoke name=\"$TOOL_NAME\">\n"
    "<@D@parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</@D@parameter>\n"
    "...\n"
    "</@D@invoke>\n"
    "<@D@invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</@D@invoke>\n"
    "</@D@tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by @TS@), you MUST output your complete reasoning "
    "inside @TS@...@TE@ BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after @TE@ with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "@SCHEMAS@\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
    "calls.\n";

const std::map<std::string, std::string_view>& task_tokens() {
  static const std::map<std::string, std::string_view> kTasks = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"},
  };
  return kTasks;
}

void dump_string(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          *out += fmt::format("\\u{:04x}", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void dump(const OrderedJson& v, std::string* out) {
  switch (v.type()) {
    case OrderedJson::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) *out += ", ";
        first = false;
        dump_string(it.key(), out);
        *out += ": ";
        dump(it.value(), out);
      }
      out->push_back('}');
      break;
    }
    case OrderedJson::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) *out += ", ";
        first = false;
        dump(e, out);
      }
      out->push_back(']');
      break;
    }
    case OrderedJson::value_t::string:
      dump_string(v.get_ref<const std::string&>(), out);
      break;
    default:
      *out += v.dump();  // null, booleans, numbers: same spelling as Python for finite values
  }
}

// A message after merge_tool_messages: user turns carry blocks of text and tool results.
struct Block {
  bool is_tool_result = false;
  std::string text;  // text, or the tool result content
  std::string tool_use_id;
};

struct Msg {
  std::string role;
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;
  std::vector<ToolCall> tool_calls;
  OrderedJson tools;
  OrderedJson response_format;
  std::optional<std::string> task;
  bool wo_eos = false;
  bool has_blocks = false;
  std::vector<Block> blocks;
};

bool has_tools(const OrderedJson& t) {
  return !t.is_null() && !(t.is_array() && t.empty()) && !(t.is_object() && t.empty());
}

std::vector<Msg> merge_tool_messages(const std::vector<ChatMessage>& messages) {
  std::vector<Msg> merged;
  for (const auto& m : messages) {
    if (m.role == "tool") {
      Block b{true, m.content.value_or(""), m.tool_call_id};
      if (!merged.empty() && merged.back().role == "user" && merged.back().has_blocks) {
        merged.back().blocks.push_back(std::move(b));
      } else {
        Msg u;
        u.role = "user";
        u.has_blocks = true;
        u.blocks.push_back(std::move(b));
        merged.push_back(std::move(u));
      }
    } else if (m.role == "user") {
      Block b{false, m.content.value_or(""), ""};
      if (!merged.empty() && merged.back().role == "user" && merged.back().has_blocks &&
          !merged.back().task) {
        merged.back().blocks.push_back(std::move(b));
      } else {
        // Like the reference, only content, task and wo_eos survive for user turns.
        Msg u;
        u.role = "user";
        u.content = m.content.value_or("");
        u.has_blocks = true;
        u.blocks.push_back(std::move(b));
        u.task = m.task;
        u.wo_eos = m.wo_eos;
        merged.push_back(std::move(u));
      }
    } else {
      Msg x;
      x.role = m.role;
      x.content = m.content;
      x.reasoning_content = m.reasoning_content;
      x.tool_calls = m.tool_calls;
      x.tools = m.tools;
      x.response_format = m.response_format;
      x.task = m.task;
      x.wo_eos = m.wo_eos;
      merged.push_back(std::move(x));
    }
  }
  return merged;
}

void sort_tool_results_by_call_order(std::vector<Msg>* messages) {
  std::map<std::string, size_t> order;
  for (auto& m : *messages) {
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < m.tool_calls.size(); ++i)
        if (!m.tool_calls[i].id.empty()) order[m.tool_calls[i].id] = i;
    } else if (m.role == "user" && m.has_blocks) {
      std::vector<Block> results;
      for (const auto& b : m.blocks)
        if (b.is_tool_result) results.push_back(b);
      if (results.size() < 2 || order.empty()) continue;
      auto key = [&](const Block& b) {
        auto it = order.find(b.tool_use_id);
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& a, const Block& b) { return key(a) < key(b); });
      size_t k = 0;
      for (auto& b : m.blocks)
        if (b.is_tool_result) b = results[k++];
    }
  }
}

int find_last_user_index(const std::vector<Msg>& msgs) {
  for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i)
    if (msgs[i].role == "user" || msgs[i].role == "developer") return i;
  return -1;
}

std::vector<Msg> drop_thinking_messages(std::vector<Msg> msgs) {
  int last_user = find_last_user_index(msgs);
  static const std::set<std::string> kKeep = {"user", "system", "tool", "latest_reminder",
                                              "direct_search_results"};
  std::vector<Msg> out;
  for (int i = 0; i < static_cast<int>(msgs.size()); ++i) {
    Msg& m = msgs[i];
    if (kKeep.count(m.role) || i >= last_user) {
      out.push_back(std::move(m));
    } else if (m.role == "assistant") {
      m.reasoning_content.reset();
      out.push_back(std::move(m));
    }
    // Anything else (developer turns) before the last user turn is dropped.
  }
  return out;
}

class Renderer {
 public:
  void trusted(std::string_view s) { add(s, true); }
  void client(std::string_view s) { add(s, false); }
  std::vector<PromptSegment> take() { return std::move(segs_); }

 private:
  void add(std::string_view s, bool t) {
    if (s.empty()) return;
    if (!segs_.empty() && segs_.back().trusted == t) {
      segs_.back().text.append(s);
    } else {
      segs_.push_back({std::string(s), t});
    }
  }
  std::vector<PromptSegment> segs_;
};

void render_tools(const OrderedJson& tools, Renderer* r, Status* st) {
  // Tools block with the schemas (client text) in place of @SCHEMAS@.
  std::string schemas;
  if (!tools.is_array()) {
    *st = invalid_argument("tools must be an array");
    return;
  }
  bool first = true;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function")) {
      *st = invalid_argument("each tool needs a \"function\" object");
      return;
    }
    if (!first) schemas += "\n";
    first = false;
    dump(t["function"], &schemas);
  }
  std::string_view tpl = kToolsTemplate;
  size_t pos = 0;
  std::string buf;
  while (pos < tpl.size()) {
    size_t at = tpl.find('@', pos);
    if (at == std::string_view::npos) {
      buf.append(tpl.substr(pos));
      break;
    }
    buf.append(tpl.substr(pos, at - pos));
    size_t close = tpl.find('@', at + 1);
    std::string_view name = tpl.substr(at + 1, close - at - 1);
    if (name == "D") {
      buf.append(kDsml);
    } else if (name == "TS") {
      buf.append(kThinkStart);
    } else if (name == "TE") {
      buf.append(kThinkEnd);
    } else {  // SCHEMAS
      r->trusted(buf);
      buf.clear();
      r->client(schemas);
    }
    pos = close + 1;
  }
  r->trusted(buf);
}

void render_arguments(const ToolCall& tc, Renderer* r) {
  OrderedJson args = OrderedJson::parse(tc.arguments, nullptr, /*allow_exceptions=*/false);
  if (!args.is_object()) {
    // The reference wraps unparsable arguments as one string parameter named "arguments".
    args = OrderedJson::object();
    args["arguments"] = tc.arguments;
  }
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) r->trusted("\n");
    first = false;
    bool is_str = it.value().is_string();
    r->trusted("<");
    r->trusted(kDsml);
    r->trusted("parameter name=\"");
    r->client(it.key());
    r->trusted(is_str ? "\" string=\"true\">" : "\" string=\"false\">");
    r->client(is_str ? it.value().get_ref<const std::string&>() : python_json_dumps(it.value()));
    r->trusted("</");
    r->trusted(kDsml);
    r->trusted("parameter>");
  }
}

Status render_message(size_t index, const std::vector<Msg>& msgs, const ChatEncodeOptions& opts,
                      bool drop_thinking, Renderer* r) {
  const Msg& msg = msgs[index];
  const bool thinking = opts.mode == ThinkingMode::kThinking;
  const int last_user = find_last_user_index(msgs);
  Status st;

  if (index == 0 && thinking && opts.effort == ReasoningEffort::kMax)
    r->trusted(kReasoningEffortMax);

  if (msg.role == "system" || msg.role == "developer") {
    if (msg.role == "developer") {
      if (!msg.content || msg.content->empty())
        return invalid_argument("a developer message needs non-empty content");
      r->trusted(kUser);
    }
    r->client(msg.content.value_or(""));
    if (has_tools(msg.tools)) {
      r->trusted("\n\n");
      render_tools(msg.tools, r, &st);
      DS_RETURN_IF_ERROR(st);
    }
    if (!msg.response_format.is_null()) {
      r->trusted("\n\n");
      r->trusted(kResponseFormatPrefix);
      r->client(python_json_dumps(msg.response_format));
    }
  } else if (msg.role == "user") {
    r->trusted(kUser);
    if (msg.has_blocks && !msg.blocks.empty()) {
      for (size_t i = 0; i < msg.blocks.size(); ++i) {
        if (i > 0) r->trusted("\n\n");
        const Block& b = msg.blocks[i];
        if (b.is_tool_result) {
          r->trusted("<tool_result>");
          r->client(b.text);
          r->trusted("</tool_result>");
        } else {
          r->client(b.text);
        }
      }
    } else {
      r->client(msg.content.value_or(""));
    }
  } else if (msg.role == "latest_reminder") {
    r->trusted(kLatestReminder);
    r->client(msg.content.value_or(""));
  } else if (msg.role == "assistant") {
    bool prev_has_task = index > 0 && msgs[index - 1].task.has_value();
    if (thinking && !prev_has_task && (!drop_thinking || static_cast<int>(index) > last_user)) {
      r->client(msg.reasoning_content.value_or(""));
      r->trusted(kThinkEnd);
    }
    r->client(msg.content.value_or(""));
    if (!msg.tool_calls.empty()) {
      r->trusted("\n\n<");
      r->trusted(kDsml);
      r->trusted("tool_calls>\n");
      for (size_t i = 0; i < msg.tool_calls.size(); ++i) {
        const ToolCall& tc = msg.tool_calls[i];
        if (i > 0) r->trusted("\n");
        r->trusted("<");
        r->trusted(kDsml);
        r->trusted("invoke name=\"");
        r->client(tc.name);
        r->trusted("\">\n");
        render_arguments(tc, r);
        r->trusted("\n</");
        r->trusted(kDsml);
        r->trusted("invoke>");
      }
      r->trusted("\n</");
      r->trusted(kDsml);
      r->trusted("tool_calls>");
    }
    if (!msg.wo_eos) r->trusted(kEos);
  } else {
    return invalid_argument(fmt::format("unsupported message role \"{}\"", msg.role));
  }

  // What follows the message: nothing before a user/system turn; the generation prompt (or a
  // task token) before an assistant or latest_reminder turn and at the end.
  if (index + 1 < msgs.size() && msgs[index + 1].role != "assistant" &&
      msgs[index + 1].role != "latest_reminder")
    return ok_status();
  if (msg.task) {
    auto it = task_tokens().find(*msg.task);
    if (it == task_tokens().end())
      return invalid_argument(fmt::format("unknown task \"{}\"", *msg.task));
    if (*msg.task != "action") {
      r->trusted(it->second);
    } else {
      r->trusted(kAssistant);
      r->trusted(thinking ? kThinkStart : kThinkEnd);
      r->trusted(it->second);
    }
  } else if (msg.role == "user" || msg.role == "developer") {
    r->trusted(kAssistant);
    bool open_thinking = thinking && (!drop_thinking || static_cast<int>(index) >= last_user);
    r->trusted(open_thinking ? kThinkStart : kThinkEnd);
  }
  return ok_status();
}

}  // namespace

std::string python_json_dumps(const OrderedJson& value) {
  std::string out;
  dump(value, &out);
  return out;
}

namespace {

// The format's own tokens, which must be single added tokens of the tokenizer.
constexpr std::string_view kChatTokens[] = {kBos,       kEos,      kUser, kAssistant,
                                            kThinkStart, kThinkEnd, kDsml};

// The id of each chat token, or an error naming the first one the tokenizer lacks.
Result<std::vector<TokenId>> chat_token_ids(const Tokenizer& tokenizer) {
  std::vector<TokenId> ids;
  for (std::string_view t : kChatTokens) {
    auto id = tokenizer.token_to_id(t);
    if (!id) return failed_precondition(fmt::format("tokenizer lacks the chat token {}", t));
    ids.push_back(*id);
  }
  return ids;
}

}  // namespace

Status validate_chat_tokens(const Tokenizer& tokenizer, size_t embedding_rows) {
  DS_ASSIGN_OR_RETURN(std::vector<TokenId> ids, chat_token_ids(tokenizer));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= embedding_rows)
      return failed_precondition(
          fmt::format("chat token {} has id {}, not below the model's "
                      "vocab_size {}",
                      kChatTokens[i], ids[i], embedding_rows));
  }
  return ok_status();
}

Result<std::vector<ChatMessage>> chat_messages_from_json(const OrderedJson& messages,
                                                         const OrderedJson& tools) {
  if (!messages.is_array()) return invalid_argument("messages must be an array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const OrderedJson& m = messages[i];
    auto err = [&](const std::string& what) {
      return invalid_argument(fmt::format("messages[{}]: {}", i, what));
    };
    if (!m.is_object()) return err("must be an object");
    ChatMessage cm;
    if (!m.contains("role") || !m["role"].is_string()) return err("role must be a string");
    cm.role = m["role"].get<std::string>();
    if (m.contains("content") && !m["content"].is_null()) {
      const OrderedJson& c = m["content"];
      if (c.is_string()) {
        cm.content = c.get<std::string>();
      } else if (c.is_array()) {
        std::string text;
        for (const auto& part : c) {
          if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
              !part.contains("text") || !part["text"].is_string())
            return err("content parts must be {\"type\": \"text\", \"text\": string}");
          text += part["text"].get<std::string>();
        }
        cm.content = std::move(text);
      } else {
        return err("content must be a string, null or an array of text parts");
      }
    }
    auto opt_string = [&](const char* key, std::optional<std::string>* dst) -> Status {
      if (!m.contains(key) || m[key].is_null()) return ok_status();
      if (!m[key].is_string()) return err(fmt::format("{} must be a string", key));
      *dst = m[key].get<std::string>();
      return ok_status();
    };
    DS_RETURN_IF_ERROR(opt_string("reasoning_content", &cm.reasoning_content));
    DS_RETURN_IF_ERROR(opt_string("task", &cm.task));
    std::optional<std::string> call_id;
    DS_RETURN_IF_ERROR(opt_string("tool_call_id", &call_id));
    cm.tool_call_id = call_id.value_or("");
    if (m.contains("wo_eos")) {
      if (!m["wo_eos"].is_boolean()) return err("wo_eos must be a bool");
      cm.wo_eos = m["wo_eos"].get<bool>();
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array()) return err("tool_calls must be an array");
      for (const auto& tc : m["tool_calls"]) {
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
          return err("each tool call needs a function object");
        const OrderedJson& f = tc["function"];
        ToolCall call;
        if (tc.contains("id") && tc["id"].is_string()) call.id = tc["id"].get<std::string>();
        if (!f.contains("name") || !f["name"].is_string())
          return err("tool call name must be a string");
        call.name = f["name"].get<std::string>();
        if (f.contains("arguments") && f["arguments"].is_string()) {
          call.arguments = f["arguments"].get<std::string>();
        } else if (f.contains("arguments") && f["arguments"].is_object()) {
          call.arguments = python_json_dumps(f["arguments"]);
        } else if (!f.contains("arguments") || f["arguments"].is_null()) {
          call.arguments = "{}";
        } else {
          return err("tool call arguments must be a string or an object");
        }
        cm.tool_calls.push_back(std::move(call));
      }
    }
    out.push_back(std::move(cm));
  }
  if (has_tools(tools)) {
    if (!tools.is_array()) return invalid_argument("tools must be an array");
    for (size_t i = 0; i < tools.size(); ++i)
      if (!tools[i].is_object() || !tools[i].contains("function") ||
          !tools[i]["function"].is_object())
        return invalid_argument(fmt::format("tools[{}]: needs a function object", i));
    auto sys = std::find_if(out.begin(), out.end(),
                            [](const ChatMessage& m) { return m.role == "system"; });
    if (sys == out.end()) {
      ChatMessage s;
      s.role = "system";
      s.content = "";
      sys = out.insert(out.begin(), std::move(s));
    }
    sys->tools = tools;
  }
  return out;
}

Result<std::vector<PromptSegment>> render_chat_segments(const std::vector<ChatMessage>& messages,
                                                        const ChatEncodeOptions& opts) {
  for (const auto& m : messages) {
    static const std::set<std::string> kRoles = {"system",    "developer", "user",
                                                 "assistant", "tool",      "latest_reminder"};
    if (!kRoles.count(m.role))
      return invalid_argument(fmt::format("unsupported message role \"{}\"", m.role));
  }
  std::vector<Msg> msgs = merge_tool_messages(messages);
  sort_tool_results_by_call_order(&msgs);
  bool drop = opts.drop_thinking;
  for (const auto& m : msgs)
    if (has_tools(m.tools)) drop = false;
  if (opts.mode == ThinkingMode::kThinking && drop) msgs = drop_thinking_messages(std::move(msgs));
  Renderer r;
  if (opts.add_bos) r.trusted(kBos);
  for (size_t i = 0; i < msgs.size(); ++i)
    DS_RETURN_IF_ERROR(render_message(i, msgs, opts, drop, &r));
  return r.take();
}

Result<std::string> render_chat(const std::vector<ChatMessage>& messages,
                                const ChatEncodeOptions& opts) {
  DS_ASSIGN_OR_RETURN(auto segs, render_chat_segments(messages, opts));
  std::string out;
  for (const auto& s : segs) out += s.text;
  return out;
}

Result<std::vector<TokenId>> encode_chat(const Tokenizer& tokenizer,
                                         const std::vector<ChatMessage>& messages,
                                         const ChatEncodeOptions& opts,
                                         const EncodeOptions& encode_opts) {
  // The format's own tokens must be single added tokens, or the model sees something else.
  DS_RETURN_IF_ERROR(chat_token_ids(tokenizer).status());
  DS_ASSIGN_OR_RETURN(auto segs, render_chat_segments(messages, opts));
  std::vector<TokenId> ids;
  std::string plain;  // text waiting to be tokenized, up to the next added token
  EncodeOptions plain_opts = encode_opts;
  plain_opts.parse_special = false;
  auto flush = [&]() -> Status {
    Status s = tokenizer.encode_plain_append(plain, plain_opts, &ids);
    plain.clear();
    return s;
  };
  for (const auto& seg : segs) {
    if (!seg.trusted) {
      plain += seg.text;
      continue;
    }
    for (const auto& piece : tokenizer.split_added(seg.text)) {
      if (piece.is_added) {
        DS_RETURN_IF_ERROR(flush());
        ids.push_back(piece.id);
      } else {
        plain.append(piece.text);
      }
    }
  }
  DS_RETURN_IF_ERROR(flush());
  // Task tokens used by the scaffolding must exist too (they would otherwise be plain text).
  for (const auto& m : messages) {
    if (m.task) {
      auto it = task_tokens().find(*m.task);
      if (it != task_tokens().end() && !tokenizer.token_to_id(it->second))
        return failed_precondition(fmt::format("tokenizer lacks the task token {}", it->second));
    }
  }
  return ids;
}

}  // namespace ds::tok
