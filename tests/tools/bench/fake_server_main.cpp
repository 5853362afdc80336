// bench_fake_server: the scripted OpenAI-compatible server of fake_openai_server.h as a process,
// for the CLI test and the README example. Usage: bench_fake_server [--port N] [--ttft-ms N]
// [--itl-ms N] [--no-usage]. Prints "listening on http://127.0.0.1:PORT" and serves until killed.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fake_openai_server.h"

int main(int argc, char** argv) {
  ds::bench::testing::FakeScript script;
  int port = 0;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](int* out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(2);
      }
      *out = std::atoi(argv[++i]);
    };
    if (!std::strcmp(argv[i], "--port"))
      next(&port);
    else if (!std::strcmp(argv[i], "--ttft-ms"))
      next(&script.ttft_ms);
    else if (!std::strcmp(argv[i], "--itl-ms"))
      next(&script.itl_ms);
    else if (!std::strcmp(argv[i], "--no-usage"))
      script.usage = false;
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  ds::bench::testing::FakeOpenAiServer server(script);
  if (!server.run_forever("127.0.0.1", port)) {
    std::fprintf(stderr, "cannot listen on port %d\n", port);
    return 1;
  }
  return 0;
}
