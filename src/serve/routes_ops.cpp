// Operations: GET /healthz (the process answers), GET /readyz (200 once the model is loaded and
// warmed up, with every engine's device and counters; 503 before), GET /metrics (Prometheus
// text), GET /v1/models (OpenAI's model list, plus this server's limits for the web page), GET
// /v1/loras and A1111's GET /sdapi/v1/loras (the LoRA files requests may name, serve --lora-dir),
// and GET / (the embedded web page).
#include "serve/http_util.h"
#include "serve/lora_request.h"
#include "serve/routes.h"
#include "serve/web_page.h"

namespace zimage::serve {

using nlohmann::json;

void add_ops_routes(RouteTable& svr, ServeContext& ctx) {
  svr.get("/healthz", guard([](const http::Request&, http::Response& res) {
            send_json(res, 200, {{"status", "ok"}});
          }),
          /*run_inline=*/true);

  svr.get("/readyz", guard([&ctx](const http::Request&, http::Response& res) {
            if (ctx.stopping.load()) {
              send_error(res, ApiError{503, "server_error", "the server is shutting down", ""});
            } else if (!ctx.ready.load()) {
              res.set_header("Retry-After", "2");
              send_error(res, ApiError{503, "server_error", "the model is loading", ""});
            } else {
              send_json(res, 200,
                        {{"status", "ready"},
                         {"device", ctx.info.device},
                         {"devices", engines_json(ctx.engines)}});
            }
          }),
          /*run_inline=*/true);

  svr.get("/metrics", guard([&ctx](const http::Request&, http::Response& res) {
            std::string text = ctx.metrics.render();
            if (ctx.ready.load() && ctx.engine != nullptr) {
              if (ctx.engines.size() <= 1) {  // several: per engine, in engines_metrics
                const Engine::Memory m = ctx.engine->memory();
                if (m.reserved_bytes > 0) text += device_memory_metrics(m);
              }
              text += engines_metrics(ctx.engines);
            }
            res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
          }));

  svr.get("/v1/models", guard([&ctx](const http::Request&, http::Response& res) {
            json model = {{"id", ctx.options.model_name},
                          {"object", "model"},
                          {"created", 0},
                          {"owned_by", "zimage"}};
            if (ctx.ready.load()) {
              const ParseLimits& l = ctx.limits;
              model["zimage"] = {
                  {"default_width", l.default_width},
                  {"default_height", l.default_height},
                  {"default_steps", l.default_steps},
                  {"size_multiple", l.request.size_multiple},
                  {"max_side", l.request.max_side},
                  {"max_batch", l.request.max_batch},
                  {"max_steps", l.request.max_steps},
                  {"device", ctx.info.device},
                  {"precision", ctx.info.precision},
                  {"version", kVersion},
                  {"engines", ctx.engines.size()},
                  // what the web page offers: ControlNet inpainting, per-request LoRAs, previews
                  {"controlnet", ctx.controlnet},
                  {"loras", !ctx.options.lora_dir.empty()},
                  {"previews", true}};
            }
            send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
          }));

  svr.get("/v1/loras", guard([&ctx](const http::Request&, http::Response& res) {
            send_json(res, 200, {{"object", "list"}, {"data", list_loras(ctx.options.lora_dir)}});
          }));

  // A1111's shape: name without the extension (what <lora:name:0.8> takes), alias, path (here
  // relative to the LoRA folder: the server's paths are not the client's business).
  svr.get("/sdapi/v1/loras", guard([&ctx](const http::Request&, http::Response& res) {
            json out = json::array();
            for (const json& f : list_loras(ctx.options.lora_dir)) {
              std::string name = f.at("name").get<std::string>();
              const std::string rel = name;
              name.resize(name.size() - std::string(".safetensors").size());
              out.push_back(
                  {{"name", name}, {"alias", name}, {"path", rel}, {"metadata", json::object()}});
            }
            send_json(res, 200, out);
          }));

  svr.get("/", guard([](const http::Request&, http::Response& res) {
            const std::string_view page = web_page();
            res.set_header("Cache-Control", "no-cache");
            res.set_header("Content-Security-Policy",
                           "default-src 'self'; img-src 'self' blob: data:; style-src 'self' "
                           "'unsafe-inline'; script-src 'self' 'unsafe-inline'; "
                           "connect-src 'self'; frame-ancestors 'none'");
            res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
          }));
}

}  // namespace zimage::serve
