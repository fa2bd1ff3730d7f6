// The HTTP/1.1 transport (see server.h).
//
// One Session per connection, its completion handlers serialised on its own strand:
//   read_head -> (checks, route, pre-routing) -> [100 Continue] -> read_body -> handler
//   -> write_response -> read_head (keep-alive) | close
// A handler runs on the handler pool (or inline on the strand); its response is written
// asynchronously on the strand. A chunked provider (SSE) runs on its handler thread and writes
// each chunk through the strand, waiting for it with a deadline, so a client that stops reading
// costs that stream's thread only until the write deadline.
#include "serve/http/server.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <future>
#include <limits>
#include <list>
#include <mutex>
#include <new>
#include <optional>
#include <regex>
#include <thread>
#include <vector>

#include "serve/http/beast_util.h"

namespace zimage::serve::http {

namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// After an early error (413, 415, 431, ...) the client may still be sending its body: it is read
// and dropped for at most this long and this many bytes before the connection closes, so the
// client sees the answer instead of a reset.
constexpr auto kDrainTime = std::chrono::seconds(2);
constexpr size_t kDrainBytes = size_t{64} << 20;

struct Route {
  std::string method;
  std::regex pattern;
  size_t body_limit = 0;
  Handler handler;
  bool run_inline = false;
  size_t form_body_limit = 0;  // multipart/form-data bodies (0: body_limit)
};

// Header values a route sets go into the response head: no CR, LF or NUL (response splitting).
std::string clean_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v)
    if (c != '\r' && c != '\n' && c != '\0') out.push_back(c);
  return out;
}

bool clean_name(const std::string& n) {
  if (n.empty()) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return false;
  return true;
}

class Session;

}  // namespace

struct Server::Impl {
  explicit Impl(ServerLimits l) : limits(l) {}

  // Declared first, destroyed last: pending handlers (and the sessions they hold) go first.
  net::io_context ioc{1};
  // Keeps the I/O threads running while no operation is pending (a handler on the pool, an
  // event stream between chunks), so what they post back still runs during stop()'s grace.
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  net::steady_timer accept_retry{ioc};
  ServerLimits limits;
  tcp::acceptor acceptor{ioc};
  std::optional<net::thread_pool> pool;
  std::vector<std::thread> io_threads;
  std::vector<Route> routes;
  std::function<bool(const Request&, Response&)> pre_routing;
  std::function<void(const Request&, Response&)> error_handler;
  std::function<void(const Request&, const Response&, double)> logger;
  Headers default_headers;

  std::mutex mu;  // guards sessions
  std::list<std::weak_ptr<Session>> sessions;
  std::atomic<int> running_handlers{0};
  std::atomic<bool> stopping{false};
  bool started = false;
  bool stopped = false;

  void accept();
  void admit(tcp::socket socket);
  const Route* find_route(Request* req) const;
  void fill_error(const Request& req, Response& res) const {
    if (res.status >= 400 && res.body.empty() && !res.streams() && error_handler) {
      try {
        error_handler(req, res);
      } catch (...) {
      }
    }
  }
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  enum class State { kHead, kBody, kHandler, kWrite, kClosed };

  Session(Server::Impl& srv, tcp::socket socket)
      : srv_(srv),
        stream_(std::move(socket)),
        buffer_(std::max<size_t>(2 * srv.limits.framing.max_header_bytes, 64 * 1024)) {}

  void start() {
    beast::error_code ec;
    const auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string();
    read_head();
  }

  State state() const { return state_.load(); }

  // From any thread: closes the connection on the session's strand.
  void close() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->close_now(); });
  }

  // From a handler thread (chunked providers): writes `data` as one chunk, or the last chunk
  // when `last`; waits for it within the write deadline. False once the connection is gone.
  bool write_chunk(std::string data, bool last);

 private:
  const ServerLimits& limits() const { return srv_.limits; }

  void read_head() {
    state_ = State::kHead;
    req_ = Request();
    req_.remote_addr = remote_;
    start_ = Clock::now();  // again once the head is in: a keep-alive wait is not the request's
    head_.emplace();
    head_->header_limit(static_cast<std::uint32_t>(limits().framing.max_header_bytes));
    head_->body_limit(std::numeric_limits<std::uint64_t>::max());  // the route's, checked below
    stream_.expires_after(std::chrono::seconds(limits().header_timeout_s));
    bhttp::async_read_header(stream_, buffer_, *head_,
                             beast::bind_front_handler(&Session::on_head, shared_from_this()));
  }

  // Beast and the standard library may throw (bad_alloc; a header value Beast refuses): such a
  // connection is closed, nothing escapes an I/O thread.
  void on_head(beast::error_code ec, size_t n) {
    try {
      read_head_done(ec, n);
    } catch (...) {
      close_now();
    }
  }

  void read_head_done(beast::error_code ec, size_t) {
    if (ec) {
      const bool quiet = ec == bhttp::error::end_of_stream || ec == net::error::eof ||
                         ec == net::error::operation_aborted || ec == net::error::connection_reset;
      if (quiet || (ec == beast::error::timeout && buffer_.size() == 0)) return close_now();
      if (ec == beast::error::timeout)
        return refuse({408,
                       "request: the head did not arrive within " +
                           std::to_string(limits().header_timeout_s) + " s",
                       "request"},
                      false);
      return refuse(detail::parse_error(ec, limits().framing, 0), false);
    }
    start_ = Clock::now();
    detail::copy_head(head_->get(), &req_);
    keep_alive_ = head_->get().keep_alive();
    const bool has_body = head_->chunked() || head_->content_length().value_or(0) > 0;
    if (auto e = check_head(req_, limits().framing)) return refuse(*e, has_body);
    if (srv_.pre_routing) {
      Response res;
      bool handled = false;
      try {
        handled = srv_.pre_routing(req_, res);
      } catch (...) {
        res = Response();
        res.status = 500;
        handled = true;
      }
      if (handled) return respond(std::move(res), has_body);
    }
    route_ = srv_.find_route(&req_);
    if (route_ == nullptr) {
      Response res;
      res.status = 404;
      return respond(std::move(res), has_body);
    }
    if (!has_body) return dispatch();
    const size_t limit = route_->form_body_limit != 0 && req_.is_multipart_form_data()
                             ? route_->form_body_limit
                             : route_->body_limit;
    if (head_->content_length() && *head_->content_length() > limit)
      return refuse(detail::parse_error(bhttp::error::body_limit, limits().framing, limit), true);
    state_ = State::kBody;
    body_.emplace(std::move(*head_));
    head_.reset();
    body_->body_limit(limit);
    body_limit_ = limit;
    body_deadline_ = Clock::now() + std::chrono::seconds(limits().body_timeout_s);
    if (req_.version >= 11 && iequals(req_.get_header_value("Expect"), "100-continue")) {
      auto line = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      stream_.expires_after(std::chrono::seconds(limits().idle_timeout_s));
      net::async_write(stream_, net::buffer(*line),
                       [self = shared_from_this(), line](beast::error_code wec, size_t) {
                         if (wec) return self->close_now();
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    const auto left = body_deadline_ - Clock::now();
    const auto idle = std::chrono::seconds(limits().idle_timeout_s);
    if (left <= Clock::duration::zero())
      return refuse(
          {408, "body: did not arrive within " + std::to_string(limits().body_timeout_s) + " s",
           "body"},
          false);
    stream_.expires_after(std::min<Clock::duration>(left, idle));
    bhttp::async_read_some(stream_, buffer_, *body_,
                           beast::bind_front_handler(&Session::on_body, shared_from_this()));
  }

  void on_body(beast::error_code ec, size_t) {
    if (ec == beast::error::timeout)
      return refuse({408, "body: the client stopped sending it", "body"}, false);
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset)
      return close_now();
    if (ec) return refuse(detail::parse_error(ec, limits().framing, body_limit_), true);
    if (!body_->is_done()) return read_body();
    req_.body = std::move(body_->get().body());
    keep_alive_ = body_->get().keep_alive();
    body_.reset();
    dispatch();
  }

  void dispatch() {
    head_.reset();
    state_ = State::kHandler;
    ++srv_.running_handlers;
    if (route_->run_inline) return run_handler();
    net::post(*srv_.pool, [self = shared_from_this()] { self->run_handler(); });
  }

  // On a handler thread (or inline on the strand).
  void run_handler() {
    Response res;
    try {
      if (auto e = parse_form(&req_)) {
        res.status = e->status;
        res.error_message = e->message;
        res.error_param = e->param;
      } else {
        route_->handler(req_, res);
      }
    } catch (const std::bad_alloc&) {
      res = Response();
      res.status = 503;
      res.error_message = "body: out of memory while reading the request";
    } catch (...) {
      res = Response();
      res.status = 500;
    }
    if (res.status == -1) res.status = 200;
    if (req_.method == "HEAD") res.provider = nullptr;  // a head only, never a stream
    if (res.streams()) {
      stream_response(std::move(res));
      --srv_.running_handlers;
      return;
    }
    --srv_.running_handlers;
    if (route_->run_inline) return respond(std::move(res), false);
    net::post(stream_.get_executor(), [self = shared_from_this(), r = std::move(res)]() mutable {
      self->respond(std::move(r), false);
    });
  }

  // An error found by the transport; `unread_body`: the client may still be sending a body.
  void refuse(const TransportError& e, bool unread_body) {
    Response res;
    res.status = e.status;
    res.error_message = e.message;
    res.error_param = e.param;
    keep_alive_ = false;
    respond(std::move(res), unread_body);
  }

  template <class Message>
  void add_headers(Message& m, const Response& res) {
    for (const auto& [name, value] : res.headers.fields())
      if (clean_name(name)) m.insert(name, clean_value(value));
    for (const auto& [name, value] : srv_.default_headers.fields())
      if (!res.headers.has(name)) m.insert(name, value);
  }

  // On the strand: writes a whole response. `unread_body`: close after it, reading and dropping
  // what the client still sends for a moment (so it sees the answer rather than a reset).
  void respond(Response res, bool unread_body) {
    try {
      write_response(std::move(res), unread_body);
    } catch (...) {
      close_now();
    }
  }

  void write_response(Response res, bool unread_body) {
    if (state_ == State::kClosed) return;
    srv_.fill_error(req_, res);
    state_ = State::kWrite;
    const bool keep = keep_alive_ && !unread_body && !srv_.stopping.load();
    auto msg = std::make_shared<bhttp::response<bhttp::string_body>>();
    msg->result(static_cast<unsigned>(res.status));
    msg->version(req_.version == 10 ? 10 : 11);
    add_headers(*msg, res);
    const bool head = req_.method == "HEAD";
    const size_t length = res.body.size();
    if (!head) msg->body() = std::move(res.body);
    msg->keep_alive(keep);
    msg->content_length(length);
    log(res);
    stream_.expires_after(std::chrono::seconds(limits().body_timeout_s));
    bhttp::async_write(
        stream_, *msg,
        [self = shared_from_this(), msg, keep, unread_body](beast::error_code ec, size_t) {
          if (ec) return self->close_now();
          if (unread_body) return self->drain();
          if (!keep) return self->close_now();
          self->read_head();
        });
  }

  // Half-closes, then reads and drops the rest of a refused request for a moment.
  void drain() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    drain_until_ = Clock::now() + kDrainTime;
    drain_some();
  }

  void drain_some() {
    const auto left = drain_until_ - Clock::now();
    if (left <= Clock::duration::zero() || drained_ > kDrainBytes) return close_now();
    buffer_.consume(buffer_.size());
    stream_.expires_after(left);
    stream_.async_read_some(buffer_.prepare(64 * 1024),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec) return self->close_now();
                              self->drain_some();
                            });
  }

  // On the handler thread: the head, then each chunk the provider writes, then the last chunk.
  void stream_response(Response res) {
    struct Head {
      bhttp::response<bhttp::empty_body> msg;
      std::optional<bhttp::response_serializer<bhttp::empty_body>> sr;
    };
    auto h = std::make_shared<Head>();
    try {
      h->msg.result(static_cast<unsigned>(res.status));
      h->msg.version(11);
      add_headers(h->msg, res);
      h->msg.keep_alive(false);
      h->msg.chunked(true);
      h->sr.emplace(h->msg);
    } catch (...) {
      close();
      return;
    }
    log(res);
    if (!wait_for([this, h](auto done) {
          state_ = State::kWrite;
          stream_.expires_after(std::chrono::seconds(limits().idle_timeout_s));
          bhttp::async_write_header(stream_, *h->sr,
                                    [h, done](beast::error_code ec, size_t) { done(!ec); });
        })) {
      close();
      return;
    }
    class Sink : public DataSink {
     public:
      explicit Sink(Session& s) : s_(s) {}
      bool write(const char* data, size_t size) override {
        if (!ok_ || done_) return false;
        if (size == 0) return true;
        ok_ = s_.write_chunk(std::string(data, size), false);
        offset_ += size;
        return ok_;
      }
      void done() override { done_ = true; }
      bool ok() const { return ok_; }
      bool finished() const { return done_; }
      size_t offset() const { return offset_; }

     private:
      Session& s_;
      bool ok_ = true;
      bool done_ = false;
      size_t offset_ = 0;
    } sink(*this);
    while (sink.ok() && !sink.finished()) {
      bool more = false;
      try {
        more = res.provider(sink.offset(), sink);
      } catch (...) {
        more = false;
      }
      if (!more) break;
    }
    if (sink.ok() && sink.finished()) write_chunk("", true);
    close();
  }

  // Starts `op` on the strand (op gets a done(bool) callback) and waits for it, at most the
  // write deadline plus a second; false when it failed or did not finish.
  template <class Op>
  bool wait_for(Op op) {
    auto promise = std::make_shared<std::promise<bool>>();
    std::future<bool> result = promise->get_future();
    auto fired = std::make_shared<std::atomic<bool>>(false);
    auto done = [promise, fired](bool ok) {
      if (!fired->exchange(true)) promise->set_value(ok);
    };
    net::post(stream_.get_executor(), [self = shared_from_this(), op, done]() mutable {
      if (self->state_ == State::kClosed) return done(false);
      op(done);
    });
    const auto limit = std::chrono::seconds(limits().idle_timeout_s + 1);
    if (result.wait_for(limit) != std::future_status::ready) return false;
    return result.get();
  }

  void log(const Response& res) {
    if (!srv_.logger) return;
    try {
      srv_.logger(req_, res,
                  std::chrono::duration<double, std::milli>(Clock::now() - start_).count());
    } catch (...) {
    }
  }

  void close_now() {
    if (state_ == State::kClosed) return;
    state_ = State::kClosed;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  Server::Impl& srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::string remote_;
  std::atomic<State> state_{State::kHead};
  std::optional<bhttp::request_parser<bhttp::empty_body>> head_;
  std::optional<bhttp::request_parser<bhttp::string_body>> body_;
  Request req_;
  const Route* route_ = nullptr;
  bool keep_alive_ = true;
  Clock::time_point start_;
  Clock::time_point body_deadline_;
  size_t body_limit_ = 0;  // the route's limit for this body (by its kind)
  Clock::time_point drain_until_;
  size_t drained_ = 0;
};

bool Session::write_chunk(std::string data, bool last) {
  auto bytes = std::make_shared<std::string>(std::move(data));
  const bool ok = wait_for([this, bytes, last](auto done) {
    stream_.expires_after(std::chrono::seconds(limits().idle_timeout_s));
    auto finish = [bytes, done](beast::error_code ec, size_t) { done(!ec); };
    if (last)
      net::async_write(stream_, bhttp::make_chunk_last(), finish);
    else
      net::async_write(stream_, bhttp::make_chunk(net::buffer(*bytes)), finish);
  });
  if (!ok) close();
  return ok;
}

}  // namespace

const Route* Server::Impl::find_route(Request* req) const {
  const std::string method = req->method == "HEAD" ? "GET" : req->method;
  for (const Route& r : routes)
    if (r.method == method && std::regex_match(req->path, req->matches, r.pattern)) return &r;
  return nullptr;
}

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || stopping.load() || !acceptor.is_open()) return;
    if (ec) {  // out of descriptors, say: retry in a moment rather than spin
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](beast::error_code) {
        if (!stopping.load()) accept();
      });
      return;
    }
    try {
      admit(std::move(socket));
    } catch (...) {  // bad_alloc: this connection is dropped, the server goes on
    }
    accept();
  });
}

void Server::Impl::admit(tcp::socket socket) {
  auto session = std::make_shared<Session>(*this, std::move(socket));
  std::shared_ptr<Session> evict;
  {
    std::lock_guard<std::mutex> lock(mu);
    sessions.remove_if([](const std::weak_ptr<Session>& w) {
      auto s = w.lock();
      return !s || s->state() == Session::State::kClosed;
    });
    if (sessions.size() >= limits.max_connections) {
      // Slow clients holding connections open with half a head are the cheapest to drop.
      for (auto it = sessions.begin(); it != sessions.end(); ++it) {
        auto s = it->lock();
        if (s && s->state() == Session::State::kHead) {
          evict = s;
          sessions.erase(it);
          break;
        }
      }
      if (!evict) {
        session.reset();
        return;  // every connection is busy: the new one is closed (the socket goes with it)
      }
    }
    sessions.push_back(session);
  }
  if (evict) evict->close();
  session->start();
}

Server::Server(ServerLimits limits) : impl_(std::make_unique<Impl>(limits)) {}

Server::~Server() {
  stop(std::chrono::milliseconds(0));
}

void Server::add(const std::string& method, const std::string& pattern, size_t body_limit,
                 Handler h, bool run_inline, size_t form_body_limit) {
  impl_->routes.push_back(
      Route{method, std::regex(pattern), body_limit, std::move(h), run_inline, form_body_limit});
}

void Server::set_pre_routing(std::function<bool(const Request&, Response&)> f) {
  impl_->pre_routing = std::move(f);
}
void Server::set_error_handler(std::function<void(const Request&, Response&)> f) {
  impl_->error_handler = std::move(f);
}
void Server::set_logger(std::function<void(const Request&, const Response&, double)> f) {
  impl_->logger = std::move(f);
}
void Server::set_default_headers(Headers h) {
  impl_->default_headers = std::move(h);
}

Result<int> Server::start(const std::string& host, int port) {
  Impl& m = *impl_;
  if (m.started) return InternalError("http: the server was started twice");
  beast::error_code ec;
  net::ip::address address = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) {  // a host name: the first address it resolves to
    tcp::resolver resolver(m.ioc);
    auto found = resolver.resolve(host, std::to_string(port), ec);
    if (ec || found.empty())
      return IoError("cannot listen on " + host + ":" + std::to_string(port) +
                     " (not an address of this machine)");
    address = found.begin()->endpoint().address();
  }
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  m.acceptor.open(endpoint.protocol(), ec);
  if (!ec) m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(endpoint, ec);
  if (!ec) m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return IoError("cannot listen on " + host + ":" + std::to_string(port) +
                   " (address in use, or not an address of this machine)");
  // Each connection is a descriptor: let the process have as many as its hard limit allows.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  const int bound = m.acceptor.local_endpoint().port();
  m.pool.emplace(static_cast<size_t>(std::max(1, m.limits.handler_threads)));
  m.work.emplace(net::make_work_guard(m.ioc));
  m.accept();
  for (int i = 0; i < std::max(1, m.limits.io_threads); ++i)
    m.io_threads.emplace_back([&m] { m.ioc.run(); });
  m.started = true;
  return bound;
}

void Server::stop(std::chrono::milliseconds grace) {
  Impl& m = *impl_;
  if (!m.started || m.stopped) return;
  m.stopped = true;
  m.stopping.store(true);
  net::post(m.ioc, [&m] {
    beast::error_code ec;
    m.acceptor.close(ec);
    m.accept_retry.cancel();
  });
  const auto deadline = Clock::now() + grace;
  while (m.running_handlers.load() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (auto& w : m.sessions)
      if (auto s = w.lock()) open.push_back(std::move(s));
    m.sessions.clear();
  }
  for (auto& s : open) s->close();
  // io_context::stop() below abandons the handlers that have not run: wait (bounded) until each
  // close has run on its connection's executor, else a connection whose close was still queued
  // (a loaded machine) stays open until the server is destroyed.
  const auto closed_by = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < closed_by &&
         std::any_of(open.begin(), open.end(), [](const std::shared_ptr<Session>& s) {
           return s->state() != Session::State::kClosed;
         }))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  open.clear();
  // Handlers still running see their connection closed (writes fail) and end.
  m.pool->join();
  m.work.reset();
  m.ioc.stop();
  for (std::thread& t : m.io_threads) t.join();
  m.io_threads.clear();
}

}  // namespace zimage::serve::http
