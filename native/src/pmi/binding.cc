// JavaScript's face of the native PMI engine (src/pmi/engine.ts types it): the PmiEngine class,
// and the codec's functions for the codec tests (test/pmi/native-codec.test.ts).
#include <napi.h>

#include "pmi/codec.h"
#include "pmi/engine.h"

namespace dpmix::pmi {

namespace {

std::vector<std::pair<std::string, std::string>> Pairs(Napi::Value v) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!v.IsArray()) return out;
  Napi::Array a = v.As<Napi::Array>();
  for (uint32_t i = 0; i < a.Length(); i++) {
    Napi::Array kv = a.Get(i).As<Napi::Array>();
    out.emplace_back(FromLatin1(kv.Get(0u)), FromLatin1(kv.Get(1u)));
  }
  return out;
}

int64_t Int(Napi::Object o, const char *key, int64_t fallback) {
  Napi::Value v = o.Get(key);
  return v.IsNumber() ? v.As<Napi::Number>().Int64Value() : fallback;
}

uint64_t Id(const Napi::Value &v) { return static_cast<uint64_t>(v.As<Napi::Number>().Int64Value()); }

class EngineWrap : public Napi::ObjectWrap<EngineWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "PmiEngine",
                       {
                           InstanceMethod<&EngineWrap::CreateJob>("createJob"),
                           InstanceMethod<&EngineWrap::RankGone>("rankGone"),
                           InstanceMethod<&EngineWrap::CloseJob>("closeJob"),
                           InstanceMethod<&EngineWrap::ReleaseJob>("releaseJob"),
                           InstanceMethod<&EngineWrap::Adopt>("adopt"),
                           InstanceMethod<&EngineWrap::Reply>("reply"),
                           InstanceMethod<&EngineWrap::CloseConn>("closeConn"),
                           InstanceMethod<&EngineWrap::Stop>("stop"),
                           InstanceMethod<&EngineWrap::Ref>("ref"),
                       });
  }

  // new PmiEngine(onEvents, { trace })
  explicit EngineWrap(const Napi::CallbackInfo &info) : Napi::ObjectWrap<EngineWrap>(info) {
    Napi::Env env = info.Env();
    if (!info[0].IsFunction()) throw Napi::TypeError::New(env, "PmiEngine(onEvents, options)");
    bool trace = info[1].IsObject() && info[1].As<Napi::Object>().Get("trace").ToBoolean();
    engine_ = std::make_unique<Engine>(env, info[0].As<Napi::Function>(), trace);
  }

 private:
  Engine &engine(Napi::Env env) {
    if (!engine_) throw Napi::Error::New(env, "the PMI engine has stopped");
    return *engine_;
  }

  Napi::Value CreateJob(const Napi::CallbackInfo &info) {
    Napi::Env env = info.Env();
    Napi::Object o = info[0].As<Napi::Object>();
    JobSpec spec;
    spec.jobId = FromLatin1(o.Get("jobId"));
    spec.kvsname = FromLatin1(o.Get("kvsname"));
    spec.size = static_cast<int>(Int(o, "size", 0));
    spec.appnum = static_cast<int>(Int(o, "appnum", 0));
    spec.universeSize = static_cast<int>(Int(o, "universeSize", spec.size));
    if (spec.size <= 0) throw Napi::RangeError::New(env, "a job needs at least one rank");
    Napi::Array node = o.Get("node").As<Napi::Array>();
    Napi::Array local = o.Get("local").As<Napi::Array>();
    for (int r = 0; r < spec.size; r++) {
      spec.node.push_back(node.Get(static_cast<uint32_t>(r)).ToNumber().Int32Value());
      spec.local.push_back(local.Get(static_cast<uint32_t>(r)).ToBoolean());
      if (spec.node.back() < 0 || spec.node.back() >= spec.size)
        throw Napi::RangeError::New(env, "node index out of range");
    }
    spec.derived = Pairs(o.Get("derived"));
    spec.localAttrs = Pairs(o.Get("localAttrs"));
    if (o.Get("limits").IsObject()) {
      Napi::Object l = o.Get("limits").As<Napi::Object>();
      spec.limits.kvEntries = Int(l, "kvEntries", spec.limits.kvEntries);
      spec.limits.kvBytes = Int(l, "kvBytes", spec.limits.kvBytes);
      spec.limits.puts = Int(l, "puts", spec.limits.puts);
    }
    spec.timeoutMs = Int(o, "timeoutMs", 0);
    return Napi::Number::New(env, static_cast<double>(engine(env).CreateJob(std::move(spec))));
  }

  void RankGone(const Napi::CallbackInfo &info) {
    engine(info.Env()).RankGone(Id(info[0]), info[1].As<Napi::Number>().Int32Value(), FromLatin1(info[2]));
  }

  void CloseJob(const Napi::CallbackInfo &info) { engine(info.Env()).CloseJob(Id(info[0]), FromLatin1(info[1])); }

  void ReleaseJob(const Napi::CallbackInfo &info) { engine(info.Env()).ReleaseJob(Id(info[0]), FromLatin1(info[1])); }

  // adopt(fd, conn, job, rank, { escapes, fullinitDue }, leftover)
  void Adopt(const Napi::CallbackInfo &info) {
    Napi::Env env = info.Env();
    ConnState state;
    Napi::Object s = info[4].As<Napi::Object>();
    state.escapes = s.Get("escapes").ToBoolean();
    state.fullinitDue = s.Get("fullinitDue").ToBoolean();
    state.skipLine = s.Get("skipLine").ToBoolean();
    state.skipBytes = static_cast<size_t>(Int(s, "skipBytes", 0));
    std::string leftover = info[5].IsString() ? FromLatin1(info[5]) : std::string();
    try {
      engine(env).Adopt(info[0].As<Napi::Number>().Int32Value(), Id(info[1]), Id(info[2]),
                        info[3].As<Napi::Number>().Int32Value(), state, std::move(leftover));
    } catch (const std::runtime_error &e) {
      throw Napi::Error::New(env, e.what());
    }
  }

  // reply(conn, seq, text | null, close)
  void Reply(const Napi::CallbackInfo &info) {
    std::optional<std::string> text;
    if (info[2].IsString()) text = FromLatin1(info[2]);
    engine(info.Env()).Reply(Id(info[0]), Id(info[1]), std::move(text), info[3].ToBoolean());
  }

  void CloseConn(const Napi::CallbackInfo &info) { engine(info.Env()).CloseConn(Id(info[0])); }

  // ref(true | false): whether the engine keeps the event loop alive.
  void Ref(const Napi::CallbackInfo &info) {
    if (engine_) engine_->Ref(info.Env(), info[0].ToBoolean());
  }

  void Stop(const Napi::CallbackInfo &) {
    if (engine_) engine_->Stop();
    engine_.reset();
  }

  std::unique_ptr<Engine> engine_;
};

// ---- the codec, for its tests ----

Napi::Value FrameObject(Napi::Env env, const Frame &f) {
  static const char *kinds[] = {"line", "block", "pmi2", "error"};
  Napi::Object o = Napi::Object::New(env);
  o.Set("kind", kinds[f.kind]);
  if (f.kind == Frame::kError) {
    o.Set("wire", f.wire);
    o.Set("message", Latin1(env, f.text));
    o.Set("fatal", f.fatal);
  } else if (f.kind == Frame::kBlock) {
    Napi::Array lines = Napi::Array::New(env);
    size_t start = 0;
    uint32_t i = 0;
    for (;;) {
      size_t nl = f.text.find('\n', start);
      lines.Set(i++,
                Latin1(env, f.text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start)));
      if (nl == std::string_view::npos) break;
      start = nl + 1;
    }
    o.Set("lines", lines);
  } else {
    o.Set(f.kind == Frame::kPmi2 ? "body" : "text", Latin1(env, f.text));
  }
  return o;
}

// codecFrames(chunks: string[]) -> { frames, pending }: each chunk appended in turn, frames taken after each.
Napi::Value CodecFrames(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Napi::Array chunks = info[0].As<Napi::Array>();
  Framer framer;
  Napi::Array frames = Napi::Array::New(env);
  uint32_t n = 0;
  for (uint32_t i = 0; i < chunks.Length(); i++) {
    std::string chunk = FromLatin1(chunks.Get(i));
    framer.Append(chunk.data(), chunk.size());
    Frame f;
    while (framer.Next(f)) frames.Set(n++, FrameObject(env, f));
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("frames", frames);
  out.Set("pending", static_cast<double>(framer.Pending()));
  return out;
}

// codecParse(wire: 1 | 2, text) -> { cmd, args: [k, v][] } | null
Napi::Value CodecParse(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  std::string text = FromLatin1(info[1]);
  Command cmd;
  bool ok = info[0].As<Napi::Number>().Int32Value() == 1 ? ParsePmi1(text, cmd) : ParsePmi2(text, cmd);
  if (!ok) return env.Null();
  Napi::Object o = Napi::Object::New(env);
  o.Set("cmd", Latin1(env, cmd.cmd));
  Napi::Array args = Napi::Array::New(env, cmd.args.size());
  for (uint32_t i = 0; i < cmd.args.size(); i++) {
    Napi::Array kv = Napi::Array::New(env, 2);
    kv.Set(0u, Latin1(env, cmd.args[i].first));
    kv.Set(1u, Latin1(env, cmd.args[i].second));
    args.Set(i, kv);
  }
  o.Set("args", args);
  return o;
}

// codecFormat(what, ...args): the formatting helpers, by name.
Napi::Value CodecFormat(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  std::string what = info[0].As<Napi::String>();
  auto arg = [&](size_t i) { return FromLatin1(info[i]); };
  if (what == "pmi1Token") return Latin1(env, Pmi1Token(arg(1)));
  if (what == "pmi1Value") return Latin1(env, Pmi1Value(arg(1)));
  if (what == "pmi2Text") return Latin1(env, Pmi2Text(arg(1)));
  if (what == "pmi1Error") return Latin1(env, Pmi1Error(arg(1), arg(2), info[3].ToBoolean()));
  if (what == "pmi2Error") {
    std::string thrid = info[3].IsString() ? arg(3) : std::string();
    std::string_view t(thrid);
    return Latin1(env, Pmi2Error(arg(1), arg(2), info[3].IsString() ? &t : nullptr));
  }
  if (what == "pmi2") {
    // pmi2(cmd, [[k, v]...], thrid | null, escape)
    std::string thrid = info[3].IsString() ? arg(3) : std::string();
    std::string_view t(thrid);
    Pmi2Reply r(arg(1), info[3].IsString() ? &t : nullptr, info[4].ToBoolean());
    for (const auto &[k, v] : Pairs(info[2])) r.Str(k, v);
    return Latin1(env, r.Done());
  }
  throw Napi::Error::New(env, "unknown codec function " + what);
}

}  // namespace

void InitPmiEngine(Napi::Env env, Napi::Object exports) {
  exports.Set("PmiEngine", EngineWrap::Define(env));
  exports.Set("pmiCodecFrames", Napi::Function::New(env, CodecFrames));
  exports.Set("pmiCodecParse", Napi::Function::New(env, CodecParse));
  exports.Set("pmiCodecFormat", Napi::Function::New(env, CodecFormat));
}

}  // namespace dpmix::pmi
