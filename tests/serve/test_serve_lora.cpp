// Per-request LoRAs over the real HTTP stack (serve --lora-dir, serve/lora_request.h): the
// "loras" field on the OpenAI endpoint and A1111's <lora:name:scale> prompt tags give the images
// diffusers makes with those LoRAs (tools/make_lora_cases.py, the tiny v_turbo model), requests
// with different sets in a row and at once (continuous batching) each get their own, names that
// leave the folder (.., absolute, symlinks out) are refused, and the folder is listed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <thread>

#include "common/npy.h"
#include "serve/lora_request.h"
#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string case_file(const std::string& name) {
  return std::string(ZIMAGE_LORA_DIR) + "/" + name;
}

// A LoRA folder: peft and kohya at the top, peft again in a subfolder, a symlink to a file
// outside the folder, and that file beside it.
struct LoraDir {
  LoraDir() {
    root = fs::temp_directory_path() / ("zimage_serve_lora_" + std::to_string(::getpid()));
    fs::remove_all(root);
    fs::create_directories(root / "loras" / "sub");
    fs::create_directories(root / "outside");
    fs::copy_file(case_file("peft.safetensors"), root / "loras" / "peft.safetensors");
    fs::copy_file(case_file("kohya.safetensors"), root / "loras" / "kohya.safetensors");
    fs::copy_file(case_file("unknown_key.safetensors"), root / "loras" / "unknown_key.safetensors");
    fs::copy_file(case_file("peft.safetensors"), root / "loras" / "sub" / "peft2.safetensors");
    fs::copy_file(case_file("kohya.safetensors"), root / "outside" / "secret.safetensors");
    fs::create_symlink(root / "outside" / "secret.safetensors",
                       root / "loras" / "escape.safetensors");
  }
  ~LoraDir() { fs::remove_all(root); }
  std::string dir() const { return (root / "loras").string(); }
  fs::path root;
};

ServeOptions with_loras(const std::string& dir, bool batching = false) {
  ServeOptions o = TestServer::defaults();
  o.lora_dir = dir;
  o.batching = batching;
  return o;
}

// The v_turbo recipe the LoRA goldens were made with, as an OpenAI body.
json turbo_body() {
  return {{"prompt", "a cat sitting on a red sofa, photo"},
          {"size", "32x32"},
          {"num_inference_steps", 2},
          {"guidance_scale", 0.0},
          {"seed", 0}};
}

// Max |diff| of the response's first image to diffusers' image of `golden` (in [0, 1]).
double diff_to_golden(const Reply& r, const std::string& golden) {
  const json j = r.json();
  if (!j.contains("data") && !j.contains("images")) {
    ADD_FAILURE() << r.body;
    return 1;
  }
  const std::string b64 = j.contains("data") ? j["data"][0]["b64_json"].get<std::string>()
                                             : j["images"][0].get<std::string>();
  auto img = png_decode(base64_decode(b64), nullptr);
  if (!img.ok()) {
    ADD_FAILURE() << img.status().to_string();
    return 1;
  }
  auto ref = zimage::test::load_npy(case_file(golden + ".image.npy"));
  if (!ref.ok() || ref->numel() != static_cast<int64_t>(img->rgb.size())) {
    ADD_FAILURE() << golden;
    return 1;
  }
  double worst = 0;
  for (size_t i = 0; i < img->rgb.size(); ++i)
    worst = std::max(worst, std::abs(img->rgb[i] / 255.0 - ref->data_as<float>()[i]));
  return worst;
}

// RGB8 rounding on top of the 1/255 parity bound; a wrong or missing LoRA is > 0.05 away.
constexpr double kTol = 1.5 / 255.0;

TEST(ServeLora, OpenAiAndA1111RequestsGetTheirLorasInARow) {
  LoraDir d;
  TestServer server(with_loras(d.dir()));
  const std::vector<std::pair<json, std::string>> runs = {
      {json::array({{{"name", "peft.safetensors"}, {"scale", 1.0}}}), "peft"},
      {json::array({{{"name", "kohya.safetensors"}}}), "kohya"},
      {nullptr, "base"},
      {json::array({{{"name", "sub/peft2.safetensors"}, {"scale", 0.7}},
                    {{"name", "kohya.safetensors"}, {"scale", -0.5}}}),
       "stack"},
      {json::array({{{"name", "peft.safetensors"}, {"scale", 0.6}}}), "peft_scaled"},
  };
  for (const auto& [loras, golden] : runs) {
    json body = turbo_body();
    if (!loras.is_null()) body["loras"] = loras;
    Reply r = post(server.port(), "/v1/images/generations", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const double diff = diff_to_golden(r, golden);
    std::printf("  openai %-12s max|diff| to diffusers %.3g\n", golden.c_str(), diff);
    EXPECT_LE(diff, kTol) << golden;
  }
  // A1111: prompt tags (with and without a strength, name without the extension) and the field.
  const std::vector<std::pair<std::string, std::string>> a1111 = {
      {"<lora:kohya:1>a cat sitting on a red sofa, photo", "kohya"},
      {"a cat sitting on a red sofa, photo<lora:peft>", "peft"},
      {"a cat sitting on a red sofa, photo", "base"},
      {"<lora:sub/peft2:0.7>a cat sitting on a red sofa, photo<lora:kohya.safetensors:-0.5>",
       "stack"},
  };
  for (const auto& [prompt, golden] : a1111) {
    json body = {{"prompt", prompt}, {"width", 32},    {"height", 32},
                 {"steps", 2},       {"cfg_scale", 0}, {"seed", 0}};
    Reply r = post(server.port(), "/sdapi/v1/txt2img", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const double diff = diff_to_golden(r, golden);
    std::printf("  a1111  %-12s max|diff| to diffusers %.3g\n", golden.c_str(), diff);
    EXPECT_LE(diff, kTol) << prompt;
  }
}

// Three requests with three sets at once on a batching server: each image is its own set's.
TEST(ServeLora, BatchingNeverMixesSets) {
  LoraDir d;
  TestServer server(with_loras(d.dir(), true));
  const std::vector<std::pair<json, std::string>> runs = {
      {json::array({{{"name", "peft.safetensors"}}}), "peft"},
      {json::array({{{"name", "kohya.safetensors"}}}), "kohya"},
      {nullptr, "base"},
      {json::array({{{"name", "peft.safetensors"}}}), "peft"},
  };
  std::vector<Reply> replies(runs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < runs.size(); ++i)
    threads.emplace_back([&, i] {
      json body = turbo_body();
      if (!runs[i].first.is_null()) body["loras"] = runs[i].first;
      replies[i] = post(server.port(), "/v1/images/generations", body.dump());
    });
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < runs.size(); ++i) {
    ASSERT_EQ(replies[i].status, 200) << replies[i].body;
    const double diff = diff_to_golden(replies[i], runs[i].second);
    std::printf("  batched %-6s max|diff| to diffusers %.3g\n", runs[i].second.c_str(), diff);
    EXPECT_LE(diff, kTol) << runs[i].second;
  }
}

TEST(ServeLora, NamesCannotLeaveTheFolder) {
  LoraDir d;
  TestServer server(with_loras(d.dir()));
  const std::vector<std::string> bad = {"../outside/secret.safetensors",
                                        "/etc/passwd",
                                        (d.root / "loras" / "peft.safetensors").string(),
                                        "sub/../../outside/secret.safetensors",
                                        "escape.safetensors",
                                        "missing.safetensors",
                                        "peft",
                                        "sub",
                                        "./peft.safetensors",
                                        "sub//peft2.safetensors",
                                        "..\\outside\\secret.safetensors",
                                        ""};
  for (const std::string& name : bad) {
    json body = turbo_body();
    body["loras"] = json::array({{{"name", name}}});
    Reply r = post(server.port(), "/v1/images/generations", body.dump());
    EXPECT_EQ(r.status, 400) << name << ": " << r.body;
    const json e = r.json()["error"];
    EXPECT_EQ(e.value("param", ""), "loras[0].name") << name << ": " << r.body;
    EXPECT_EQ(r.body.find(d.root.string()), std::string::npos) << "leaks the path: " << r.body;
  }
  for (const char* prompt : {"<lora:../outside/secret:1>a cat", "<lora:escape:1>a cat",
                             "<lora:peft:x>a cat", "<lora:peft:1 a cat"}) {
    json body = {{"prompt", prompt}, {"width", 32}, {"height", 32}, {"steps", 2}};
    Reply r = post(server.port(), "/sdapi/v1/txt2img", body.dump());
    EXPECT_EQ(r.status, 400) << prompt << ": " << r.body;
  }
  // A file whose keys match no transformer weight: 400 before queueing, naming the LoRA as the
  // client did and the key, not the server's path.
  {
    json body = turbo_body();
    body["loras"] =
        json::array({{{"name", "peft.safetensors"}}, {{"name", "unknown_key.safetensors"}}});
    Reply r = post(server.port(), "/v1/images/generations", body.dump());
    EXPECT_EQ(r.status, 400) << r.body;
    const std::string msg = r.json()["error"].value("message", "");
    EXPECT_EQ(msg.rfind("loras: unknown_key.safetensors: ", 0), 0u) << msg;
    EXPECT_NE(msg.find("'transformer.layers.0.attention.to_x.lora_A.weight'"), std::string::npos)
        << msg;
    EXPECT_EQ(r.body.find(d.root.string()), std::string::npos) << "leaks the path: " << r.body;
    json a = {{"prompt", "<lora:unknown_key>a cat"}, {"width", 32}, {"height", 32}, {"steps", 2}};
    EXPECT_EQ(post(server.port(), "/sdapi/v1/txt2img", a.dump()).status, 400);
  }
  // Malformed fields.
  for (const char* loras : {R"("peft.safetensors")", R"([{"name": "peft.safetensors", "x": 1}])",
                            R"([{"name": "peft.safetensors", "scale": "1"}])",
                            R"([{"name": "peft.safetensors", "scale": 1e9}])", R"([7])"}) {
    json body = turbo_body();
    body["loras"] = json::parse(loras);
    Reply r = post(server.port(), "/v1/images/generations", body.dump());
    EXPECT_EQ(r.status, 400) << loras << ": " << r.body;
    EXPECT_EQ(r.json()["error"].value("param", "").rfind("loras", 0), 0u) << r.body;
  }
}

TEST(ServeLora, ListsTheFolderAndRefusesLorasWithoutOne) {
  LoraDir d;
  {
    TestServer server(with_loras(d.dir()));
    Reply r = get(server.port(), "/v1/loras");
    ASSERT_EQ(r.status, 200) << r.body;
    std::vector<std::string> names;
    const json listing = r.json();
    for (const json& f : listing["data"]) names.push_back(f["name"]);
    // The symlink to a file outside the folder is not listed.
    EXPECT_EQ(names,
              (std::vector<std::string>{"kohya.safetensors", "peft.safetensors",
                                        "sub/peft2.safetensors", "unknown_key.safetensors"}));
    Reply a = get(server.port(), "/sdapi/v1/loras");
    ASSERT_EQ(a.status, 200);
    EXPECT_EQ(a.json()[1]["name"], "peft");
    EXPECT_EQ(a.body.find(d.root.string()), std::string::npos) << a.body;
  }
  TestServer plain;
  json body = turbo_body();
  body["loras"] = json::array({{{"name", "peft.safetensors"}}});
  Reply r = post(plain.port(), "/v1/images/generations", body.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("--lora-dir"), std::string::npos) << r.body;
  EXPECT_EQ(get(plain.port(), "/v1/loras").json()["data"].size(), 0u);
}

// Links inside the folder are listed under their own names, which are what a request resolves:
// a file link (once under its name, the target under its own), a folder link to a folder inside;
// a link out of the folder, a folder link out of it and one back up the tree (a cycle) are not
// walked. Every name listed resolves, on /v1/loras and /sdapi/v1/loras alike.
TEST(ServeLora, LinksAreListedUnderTheNamesRequestsGive) {
  LoraDir d;
  const fs::path loras = d.root / "loras";
  fs::create_symlink("peft.safetensors", loras / "alias.safetensors");
  fs::create_directory_symlink("sub", loras / "linked");
  fs::create_directory_symlink(d.root / "outside", loras / "away");
  fs::create_directory_symlink("..", loras / "sub" / "up");
  const std::vector<std::string> want = {"alias.safetensors",        "kohya.safetensors",
                                         "linked/peft2.safetensors", "peft.safetensors",
                                         "sub/peft2.safetensors",    "unknown_key.safetensors"};
  std::vector<std::string> names;
  for (const json& f : list_loras(d.dir())) names.push_back(f["name"]);
  EXPECT_EQ(names, want);
  for (const std::string& name : names) {
    std::vector<GenerateRequest> runs(1);
    runs[0].loras = {LoraSpec{name, 1.0f}};
    const Status st = resolve_lora_names(runs, d.dir());
    EXPECT_TRUE(st.ok()) << name << ": " << st.to_string();
  }
  // The link's size is its file's.
  const json listed = list_loras(d.dir());
  EXPECT_EQ(listed[0]["bytes"], listed[3]["bytes"]);

  TestServer server(with_loras(d.dir()));
  Reply r = get(server.port(), "/v1/loras");
  ASSERT_EQ(r.status, 200) << r.body;
  names.clear();
  const json data = r.json()["data"];  // a copy: the loop must not range over a temporary's part
  for (const json& f : data) names.push_back(f["name"]);
  EXPECT_EQ(names, want);
  Reply a = get(server.port(), "/sdapi/v1/loras");
  ASSERT_EQ(a.status, 200) << a.body;
  names.clear();
  const json a1111 = a.json();
  for (const json& f : a1111) names.push_back(f["path"]);
  EXPECT_EQ(names, want);
  EXPECT_EQ(a1111[0]["name"], "alias");
  // The link's own name works in a request (A1111 tag and "loras" field).
  json body = turbo_body();
  body["loras"] = json::array({{{"name", "alias.safetensors"}}});
  Reply g = post(server.port(), "/v1/images/generations", body.dump());
  EXPECT_EQ(g.status, 200) << g.body;
}

// /v1/images/edits carries "loras" as a form field holding JSON: the same LoRA twice gives the
// same image, a different one (or none) another; a name out of the folder is refused.
TEST(ServeLora, EditsTakeLorasAsAFormField) {
  LoraDir d;
  TestServer server(with_loras(d.dir()));
  Image init;
  init.width = init.height = 32;
  init.rgb.resize(32 * 32 * 3);
  for (size_t i = 0; i < init.rgb.size(); ++i) init.rgb[i] = static_cast<uint8_t>(i * 7);
  auto png = png_encode(init);
  ASSERT_TRUE(png.ok());
  const std::string png_bytes(png->begin(), png->end());
  auto edit = [&](const std::string& loras) {
    httplib::MultipartFormDataItems items = {{"image", png_bytes, "in.png", "image/png"},
                                             {"prompt", "a cat", "", ""},
                                             {"num_inference_steps", "2", "", ""},
                                             {"seed", "3", "", ""},
                                             {"strength", "0.9", "", ""}};
    if (!loras.empty()) items.push_back({"loras", loras, "", ""});
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(120, 0);
    auto res = c.Post("/v1/images/edits", items);
    Reply r;
    if (res) r.status = res->status, r.body = res->body;
    return r;
  };
  auto first_png = [](const Reply& r) {
    return r.json()["data"][0]["b64_json"].get<std::string>();
  };
  const Reply none = edit(""), peft = edit(R"([{"name": "peft.safetensors"}])"),
              again = edit(R"([{"name": "peft.safetensors", "scale": 1}])"),
              kohya = edit(R"([{"name": "kohya.safetensors"}])");
  for (const Reply* r : {&none, &peft, &again, &kohya}) ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(first_png(peft), first_png(again));
  EXPECT_NE(first_png(peft), first_png(none));
  EXPECT_NE(first_png(peft), first_png(kohya));
  const Reply bad = edit(R"([{"name": "../outside/secret.safetensors"}])");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(edit("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]").status,
            400);
}

TEST(ServeLora, PromptTagsAreParsedAndRemoved) {
  std::string p = "<lora:a:0.5>x <lora:b>y<lora:c.safetensors:-2>";
  std::vector<LoraSpec> l;
  ASSERT_TRUE(take_prompt_loras(&p, &l).ok());
  EXPECT_EQ(p, "x y");
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0].path, "a.safetensors");
  EXPECT_EQ(l[0].scale, 0.5f);
  EXPECT_EQ(l[1].path, "b.safetensors");
  EXPECT_EQ(l[1].scale, 1.0f);
  EXPECT_EQ(l[2].path, "c.safetensors");
  EXPECT_EQ(l[2].scale, -2.0f);
}

}  // namespace
}  // namespace zimage::serve::test
