// text_generation_cli: Megatron-LM's tools/text_generation_cli.py — an interactive client of
// run_text_generation_server.
//
//   text_generation_cli HOST:PORT
//
// Loops: "Enter prompt: ", "Enter number of tokens to generate: ", then PUT http://HOST:PORT/api
// {"prompts": [prompt], "tokens_to_generate": N} and prints "Megatron Response: " and the text, or
// "Error <status>: <message>". Ends at end of input (Ctrl-D). A connection failure prints one line
// naming the URL and exits 1.
#include <httplib.h>

#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>
#include "megatron/core/utils/signals.h"

using nlohmann::json;

int main(int argc, char** argv) {
  megatron::ignore_file_size_signal();  // writes past `ulimit -f` fail with EFBIG, not a signal
  if (argc != 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: text_generation_cli HOST:PORT   (the address of run_text_generation_server)\n");
    return argc == 2 ? 0 : 2;
  }
  const std::string url = std::string("http://") + argv[1];
  httplib::Client client(url);
  client.set_read_timeout(3600, 0);  // generations can be long
  while (true) {
    std::string prompt, n;
    std::cout << "Enter prompt: " << std::flush;
    if (!std::getline(std::cin, prompt)) break;
    std::cout << "Enter number of tokens to generate: " << std::flush;
    if (!std::getline(std::cin, n)) break;
    json tokens = json::parse(n, nullptr, false);  // Python's ast.literal_eval of a number
    if (tokens.is_discarded() || !tokens.is_number()) {
      std::cout << "Error: '" << n << "' is not a number" << std::endl;
      continue;
    }
    json data = {{"prompts", {prompt}}, {"tokens_to_generate", tokens}};
    auto res = client.Put("/api", data.dump(), "application/json");
    if (!res) {
      std::fprintf(stderr, "error: cannot reach %s/api (%s)\n", url.c_str(), httplib::to_string(res.error()).c_str());
      return 1;
    }
    json body = json::parse(res->body, nullptr, false);
    if (res->status != 200) {
      // Megatron's errors are a JSON string; a malformed-JSON reply is {"message": ...}.
      std::string msg = body.is_string() ? body.get<std::string>()
                        : body.is_object() && body.contains("message") ? body["message"].dump()
                                                                        : res->body;
      std::cout << "Error " << res->status << ": " << msg << std::endl;
    } else if (body.is_object() && body.contains("text") && body["text"].is_array() && !body["text"].empty()) {
      std::cout << "Megatron Response: " << std::endl << body["text"][0].get<std::string>() << std::endl;
    } else {
      std::cout << "Error: unexpected response " << res->body << std::endl;
    }
  }
  return 0;
}
