// HTTP/1.1 messages as the routes see them: a Request whose head and body the transport has
// already read and checked (http/server.h), and the Response a route fills. Why our own types
// rather than a library's: the transport (Boost.Beast) stays inside http/server.cpp, and the
// routes keep a small, stable surface: headers looked up case-insensitively, path captures, the
// parts of a multipart/form-data body, and a chunked provider for streams (Server-Sent Events).
#pragma once

#include <cstddef>
#include <functional>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zimage::serve::http {

// Header fields in arrival order; names compare case-insensitively (RFC 9110 §5.1).
class Headers {
 public:
  void add(std::string name, std::string value);
  // Replaces every field of that name with one.
  void set(const std::string& name, std::string value);
  bool has(std::string_view name) const;
  size_t count(std::string_view name) const;
  // The first value of `name`, or "" when absent.
  const std::string& get(std::string_view name) const;
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }
  size_t size() const { return fields_.size(); }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

bool iequals(std::string_view a, std::string_view b);

// One part of a multipart/form-data body (http/multipart.h).
struct FormFile {
  std::string filename;      // "" for a plain text field
  std::string content_type;  // the part's Content-Type, "" when it gives none
  std::string content;
};

struct Request {
  std::string method;  // "GET", "POST", ... ("HEAD" is served by the GET route)
  std::string target;  // as sent: path and query
  std::string path;    // percent-decoded, without the query
  std::string query;   // after '?', undecoded
  int version = 11;    // 10 or 11
  Headers headers;
  std::string body;
  std::smatch matches;  // the route pattern's captures on `path`
  // Parts of a multipart/form-data body, in order, by field name.
  std::vector<std::pair<std::string, FormFile>> files;
  std::string remote_addr;

  const std::string& get_header_value(std::string_view name) const { return headers.get(name); }
  bool has_header(std::string_view name) const { return headers.has(name); }
  bool is_multipart_form_data() const;
};

// Where a chunked provider writes; write() returns false once the client is gone.
class DataSink {
 public:
  virtual ~DataSink() = default;
  virtual bool write(const char* data, size_t size) = 0;
  virtual void done() = 0;  // the stream is complete
};

// Called until it returns false or calls sink.done(); `offset` is the bytes written so far.
using ChunkedProvider = std::function<bool(size_t offset, DataSink& sink)>;

struct Response {
  int status = -1;  // -1: the route set none (200)
  Headers headers;
  std::string body;
  ChunkedProvider provider;  // set: the body is streamed (chunked) instead of `body`
  // Set by the transport for errors it answers itself (413, 431, ...): what the error
  // handler writes into the JSON body, and the field it is about.
  std::string error_message;
  std::string error_param;

  void set_header(const std::string& name, std::string value) {
    headers.set(name, std::move(value));
  }
  void set_content(std::string content, const std::string& content_type);
  void set_content(const char* data, size_t size, const std::string& content_type);
  void set_chunked_content_provider(const std::string& content_type, ChunkedProvider p);
  bool streams() const { return static_cast<bool>(provider); }
};

// "%41" -> "A"; malformed escapes stay as they are; '+' is not a space (a path, not a form).
std::string percent_decode(std::string_view s);

}  // namespace zimage::serve::http
