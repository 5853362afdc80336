// The web UI served at GET /: one self-contained HTML page (src/server/web/index.html) embedded
// into the binary at build time (CMake writes it into a generated source file).
#pragma once

#include <string>

namespace ds::server {

const std::string& web_ui_html();

}  // namespace ds::server
