// The PMI-1 / PMI-2 wire codec of the native PMI engine: framing, parsing of the commands the
// engine answers itself, and reply formatting. Bytes are chars, one per byte (latin1), as the
// TypeScript codec (src/pmi/wire-framer.ts, pmi1-codec.ts, pmi2-codec.ts) reads them, and every
// rule here is that codec's: the two must frame, parse and squeeze alike (test/pmi/native-codec).
//
// Parsing is strict and says only yes or no: a frame the engine cannot parse (or a command it
// does not serve) goes to JavaScript whole, and the TypeScript codec words the error.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpmix::pmi {

// limits.ts: the advertised maxima and the frame bounds that follow from them.
constexpr int kKvsnameMax = 256;
constexpr int kKeyMax = 64;
constexpr int kValueMax = 1024;
constexpr size_t kPmi1MaxLine = 29 + kKvsnameMax + kKeyMax + kValueMax;  // 'cmd=put kvsname= key= value=\n'
constexpr size_t kPmi1MaxBlock = 64 * 1024;
constexpr size_t kPmi2MaxBody = 64 * 1024;
constexpr size_t kPmi2Header = 6;

struct Frame {
  enum Kind { kLine, kBlock, kPmi2, kError } kind = kLine;
  // kLine: the line without its newline (and a trailing \r); kBlock: the lines before endcmd,
  // joined by \n; kPmi2: the body; kError: the message.
  std::string_view text;
  int wire = 0;  // kError: 1, 2, or 0 when the wire could not be told
  bool fatal = false;
};

// Cuts a byte stream into frames (wire-framer.ts). Memory stays bounded: nothing longer than a
// frame's limit is buffered, an over-long line or PMI-2 body is skipped and reported.
class Framer {
 public:
  void Append(const char *data, size_t n);
  // The next complete frame; its text stays valid until the next Append. False: more bytes needed.
  bool Next(Frame &f);
  // Bytes buffered and not yet framed.
  size_t Pending() const { return buf_.size() - off_; }
  bool Dead() const { return dead_; }
  // Takes over a stream another framer began (wire-framer.ts rest()): the rest of an over-long
  // line, or `bytes` more of an over-long PMI-2 body, is skipped first.
  void Skip(bool line, size_t bytes);

 private:
  bool SkipAhead();
  bool Line(Frame &f);
  bool Block(Frame &f);
  bool Pmi2(size_t len, Frame &f);
  std::string_view Rest() const { return std::string_view(buf_).substr(off_); }
  void Consume(size_t n) { off_ += n; }

  std::string buf_;
  size_t off_ = 0;
  enum { kNone, kUntilNewline, kBytes } skip_ = kNone;
  size_t skip_left_ = 0;
  bool dead_ = false;
  // Where the scan of a spawn block still arriving resumes (from off_): a block fed a byte at a
  // time costs linear, not quadratic, work.
  size_t blockPos_ = 0;
};

// One command as parsed: its name and its key=value tokens in order (values are views into the
// frame, or into `owned` where PMI-2 unescaping had to copy).
struct Command {
  std::string_view cmd;
  std::vector<std::pair<std::string_view, std::string_view>> args;
  std::vector<std::string> owned;
  // The first value of `key`, or nullptr.
  const std::string_view *Get(std::string_view key) const;
};

// pmi1-codec.ts parsePmi1Line: false where it would throw.
bool ParsePmi1(std::string_view line, Command &out);
// pmi2-codec.ts parsePmi2Body: false where it would throw.
bool ParsePmi2(std::string_view body, Command &out);

// pmi1-codec.ts pmi1Token: free text as one PMI-1 token both MPICH 4.0.2 and 5.x parse.
std::string Pmi1Token(std::string_view text);
// pmi1-codec.ts pmi1Value: a stored value on its way to a PMI-1 client. `v` itself unless it
// holds whitespace (values put over PMI-1 never do), else a squeezed copy in `scratch`.
std::string_view Pmi1Value(std::string_view v, std::string &scratch);
inline std::string Pmi1Value(std::string_view v) {
  std::string scratch;
  return std::string(Pmi1Value(v, scratch));
}
// pmi2-codec.ts pmi2Text: free text as a PMI-2 value.
std::string Pmi2Text(std::string_view text);

// A PMI-1 reply line under construction: `cmd=<name> k=v ...\n`.
class Pmi1Reply {
 public:
  // `room`: bytes of values to come, reserved up front.
  explicit Pmi1Reply(std::string_view cmd, size_t room = 0);
  Pmi1Reply &Str(std::string_view key, std::string_view value);
  Pmi1Reply &Int(std::string_view key, long value);
  // The line, newline included.
  std::string Done();

 private:
  std::string s_;
};

// `cmd=<response> rc=-1 msg=<token>\n`; with `failed`, a trailing bare token that fails clients
// which ignore rc (pmi1-codec.ts formatPmi1Failure).
std::string Pmi1Error(std::string_view response, std::string_view message, bool failed = false);

// A PMI-2 reply frame under construction: `cmd=<name>;[thrid=..;]k=v;...`, length-prefixed.
class Pmi2Reply {
 public:
  Pmi2Reply(std::string_view cmd, const std::string_view *thrid, bool escape);
  Pmi2Reply &Str(std::string_view key, std::string_view value);
  Pmi2Reply &Int(std::string_view key, long value);
  Pmi2Reply &Bool(std::string_view key, bool value) { return Str(key, value ? "TRUE" : "FALSE"); }
  // The frame: the body behind its 6-character length.
  std::string Done();

 private:
  std::string body_;
  bool escape_;
};

std::string Pmi2Error(std::string_view response, std::string_view message, const std::string_view *thrid);

}  // namespace dpmix::pmi
