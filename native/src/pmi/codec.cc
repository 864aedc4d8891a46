#include "pmi/codec.h"

#include <algorithm>
#include <cstdio>

namespace dpmix::pmi {

namespace {

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// /^ *\d* *$/ (a PMI-2 length still arriving).
bool SpacesDigitsSpaces(std::string_view s, size_t *digits = nullptr) {
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') i++;
  size_t d = i;
  while (i < s.size() && IsDigit(s[i])) i++;
  if (digits) *digits = i - d;
  while (i < s.size() && s[i] == ' ') i++;
  return i == s.size();
}

// JavaScript's \s over latin1 characters.
bool IsJsSpace(unsigned char c) { return (c >= 9 && c <= 13) || c == ' ' || c == 0xa0; }

}  // namespace

// ---- framing ----------------------------------------------------------------------------------

void Framer::Append(const char *data, size_t n) {
  if (dead_) return;
  if (off_ > 0 && (off_ == buf_.size() || off_ >= 4096)) {
    buf_.erase(0, off_);
    off_ = 0;
  }
  buf_.append(data, n);
}

void Framer::Skip(bool line, size_t bytes) {
  if (line) {
    skip_ = kUntilNewline;
  } else if (bytes > 0) {
    skip_ = kBytes;
    skip_left_ = bytes;
  }
}

bool Framer::SkipAhead() {
  if (skip_ == kUntilNewline) {
    size_t nl = Rest().find('\n');
    if (nl == std::string_view::npos) {
      off_ = buf_.size();
      return false;
    }
    Consume(nl + 1);
  } else {
    size_t n = std::min(skip_left_, Pending());
    Consume(n);
    skip_left_ -= n;
    if (skip_left_ > 0) return false;
  }
  skip_ = kNone;
  return true;
}

bool Framer::Next(Frame &f) {
  if (dead_) return false;
  if (skip_ != kNone && !SkipAhead()) return false;
  std::string_view b = Rest();
  if (b.empty()) return false;
  if (StartsWith(b, "cmd=")) return Line(f);
  if (StartsWith(b, "mcmd=")) return Block(f);
  // Not enough bytes yet to tell a PMI-1 prefix from a PMI-2 length.
  if (b.size() < kPmi2Header && (StartsWith("cmd=", b) || StartsWith("mcmd=", b) || SpacesDigitsSpaces(b)))
    return false;
  std::string_view head = b.substr(0, kPmi2Header);
  size_t digits = 0;
  if (SpacesDigitsSpaces(head, &digits) && digits >= 1) {
    size_t len = 0;
    for (char c : head) {
      if (IsDigit(c)) len = len * 10 + static_cast<size_t>(c - '0');
    }
    return Pmi2(len, f);
  }
  f = Frame{Frame::kError, "not a PMI command: expected cmd=, mcmd= or a 6-digit PMI-2 length", 0, true};
  dead_ = true;
  buf_.clear();
  off_ = 0;
  return true;
}

bool Framer::Line(Frame &f) {
  std::string_view b = Rest();
  size_t nl = b.find('\n');
  if (nl == std::string_view::npos || nl + 1 > kPmi1MaxLine) {
    if (nl == std::string_view::npos && b.size() < kPmi1MaxLine) return false;
    // Too long: dropped up to its newline (which may not have arrived yet).
    if (nl == std::string_view::npos) {
      off_ = buf_.size();
      skip_ = kUntilNewline;
    } else {
      Consume(nl + 1);
    }
    static const std::string msg = "line longer than " + std::to_string(kPmi1MaxLine) + " bytes";
    f = Frame{Frame::kError, msg, 1, false};
    return true;
  }
  std::string_view text = b.substr(0, nl);
  Consume(nl + 1);
  if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
  f = Frame{Frame::kLine, text, 1, false};
  return true;
}

bool Framer::Block(Frame &f) {
  std::string_view b = Rest();
  size_t pos = blockPos_;
  for (;;) {
    size_t nl = b.find('\n', pos);
    if (nl == std::string_view::npos || nl + 1 - pos > kPmi1MaxLine || nl + 1 > kPmi1MaxBlock) {
      bool tooLong =
          nl == std::string_view::npos ? (b.size() - pos >= kPmi1MaxLine || b.size() >= kPmi1MaxBlock) : true;
      if (!tooLong) {
        blockPos_ = pos;
        return false;
      }
      blockPos_ = 0;
      // The rest of a broken block cannot be told from garbage: the stream is given up.
      static const std::string msg = "spawn block line longer than " + std::to_string(kPmi1MaxLine) +
                                     " bytes or block longer than " + std::to_string(kPmi1MaxBlock) + " bytes";
      f = Frame{Frame::kError, msg, 1, true};
      dead_ = true;
      buf_.clear();
      off_ = 0;
      return true;
    }
    if (b.substr(pos, nl - pos) == "endcmd") {
      blockPos_ = 0;
      f = Frame{Frame::kBlock, b.substr(0, pos - 1), 1, false};
      Consume(nl + 1);
      return true;
    }
    pos = nl + 1;
  }
}

bool Framer::Pmi2(size_t len, Frame &f) {
  if (len == 0 || len > kPmi2MaxBody) {
    Consume(kPmi2Header);
    skip_ = kBytes;
    skip_left_ = len;
    static const std::string tooLong = "PMI-2 command longer than " + std::to_string(kPmi2MaxBody) + " bytes";
    f = Frame{Frame::kError, len == 0 ? std::string_view("empty PMI-2 command") : std::string_view(tooLong), 2, false};
    return true;
  }
  if (Pending() < kPmi2Header + len) return false;
  f = Frame{Frame::kPmi2, Rest().substr(kPmi2Header, len), 2, false};
  Consume(kPmi2Header + len);
  return true;
}

// ---- parsing ----------------------------------------------------------------------------------

const std::string_view *Command::Get(std::string_view key) const {
  for (const auto &kv : args) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

bool ParsePmi1(std::string_view line, Command &out) {
  out.cmd = {};
  out.args.clear();
  out.owned.clear();
  if (!StartsWith(line, "cmd=")) return false;
  bool haveCmd = false;
  const size_t n = line.size();
  for (size_t i = 0; i < n;) {
    if (line[i] == ' ') {
      i++;
      continue;
    }
    size_t end = line.find(' ', i);
    if (end == std::string_view::npos) end = n;
    size_t eq = line.find('=', i);
    if (eq == std::string_view::npos || eq <= i || eq >= end) return false;
    std::string_view key = line.substr(i, eq - i);
    std::string_view value = line.substr(eq + 1, end - eq - 1);
    i = end + 1;
    if (key == "cmd") {
      if (haveCmd) return false;
      out.cmd = value;
      haveCmd = true;
    } else {
      if (out.Get(key)) return false;
      out.args.emplace_back(key, value);
    }
  }
  return !out.cmd.empty();
}

bool ParsePmi2(std::string_view body, Command &out) {
  out.cmd = {};
  out.args.clear();
  out.owned.clear();
  if (!StartsWith(body, "cmd=")) return false;
  std::vector<std::string_view> tokens;
  if (body.find(";;") == std::string_view::npos) {
    size_t start = 0;
    for (;;) {
      size_t semi = body.find(';', start);
      tokens.push_back(body.substr(start, semi == std::string_view::npos ? std::string_view::npos : semi - start));
      if (semi == std::string_view::npos) break;
      start = semi + 1;
    }
  } else {
    // The older clients escape a ';' inside a value as ';;'.
    std::string cur;
    for (size_t i = 0; i < body.size(); i++) {
      char ch = body[i];
      if (ch != ';') {
        cur += ch;
      } else if (i + 1 < body.size() && body[i + 1] == ';') {
        cur += ';';
        i++;
      } else {
        out.owned.push_back(std::move(cur));
        cur.clear();
      }
    }
    out.owned.push_back(std::move(cur));
    for (const auto &t : out.owned) tokens.emplace_back(t);
  }
  bool haveCmd = false;
  for (std::string_view t : tokens) {
    while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
    if (t.empty()) continue;
    size_t eq = t.find('=');
    if (eq == std::string_view::npos || eq == 0) return false;
    std::string_view key = t.substr(0, eq);
    if (key.find_first_of(" \n") != std::string_view::npos) return false;
    std::string_view value = t.substr(eq + 1);
    if (key == "cmd") {
      if (haveCmd) return false;
      out.cmd = value;
      haveCmd = true;
      continue;
    }
    out.args.emplace_back(key, value);
  }
  return !out.cmd.empty();
}

// ---- formatting -------------------------------------------------------------------------------

std::string Pmi1Token(std::string_view text) {
  std::string t;
  t.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (IsJsSpace(c)) {
      t += '_';
      while (i < text.size() && IsJsSpace(static_cast<unsigned char>(text[i]))) i++;
      continue;
    }
    t += (c < 0x21 || c > 0x7e) ? '?' : static_cast<char>(c);
    i++;
  }
  if (t.empty()) return "_";
  if (t.size() > 400) t.resize(400);
  return t;
}

std::string_view Pmi1Value(std::string_view v, std::string &scratch) {
  size_t i = 0;
  while (i < v.size() && !IsJsSpace(static_cast<unsigned char>(v[i]))) i++;
  if (i == v.size()) return v;
  scratch.assign(v);
  for (; i < scratch.size(); i++) {
    if (IsJsSpace(static_cast<unsigned char>(scratch[i]))) scratch[i] = '_';
  }
  return scratch;
}

std::string Pmi2Text(std::string_view text) {
  std::string t;
  t.reserve(std::min<size_t>(text.size(), 400));
  for (char ch : text) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c == ';' || c == '\n' || c == '\r')
      t += ',';
    else
      t += (c < 0x20 || c > 0x7e) ? '?' : ch;
    if (t.size() == 400) break;
  }
  return t;
}

Pmi1Reply::Pmi1Reply(std::string_view cmd, size_t room) {
  s_.reserve(64 + room);
  s_ += "cmd=";
  s_ += cmd;
}

Pmi1Reply &Pmi1Reply::Str(std::string_view key, std::string_view value) {
  s_ += ' ';
  s_ += key;
  s_ += '=';
  s_ += value;
  return *this;
}

Pmi1Reply &Pmi1Reply::Int(std::string_view key, long value) { return Str(key, std::to_string(value)); }

std::string Pmi1Reply::Done() {
  s_ += '\n';
  return std::move(s_);
}

std::string Pmi1Error(std::string_view response, std::string_view message, bool failed) {
  std::string s = Pmi1Reply(response).Str("rc", "-1").Str("msg", Pmi1Token(message)).Done();
  if (failed) {
    s.pop_back();
    s += " failed\n";
  }
  return s;
}

Pmi2Reply::Pmi2Reply(std::string_view cmd, const std::string_view *thrid, bool escape) : escape_(escape) {
  body_.reserve(96);
  body_ += "cmd=";
  body_ += cmd;
  body_ += ';';
  if (thrid) {
    body_ += "thrid=";
    body_ += *thrid;
    body_ += ';';
  }
}

Pmi2Reply &Pmi2Reply::Str(std::string_view key, std::string_view value) {
  body_ += key;
  body_ += '=';
  if (escape_ && value.find(';') != std::string_view::npos) {
    for (char c : value) {
      body_ += c;
      if (c == ';') body_ += ';';
    }
  } else {
    body_ += value;
  }
  body_ += ';';
  return *this;
}

Pmi2Reply &Pmi2Reply::Int(std::string_view key, long value) { return Str(key, std::to_string(value)); }

std::string Pmi2Reply::Done() {
  char head[16];
  std::snprintf(head, sizeof head, "%6zu", body_.size());
  return std::string(head) + body_;
}

std::string Pmi2Error(std::string_view response, std::string_view message, const std::string_view *thrid) {
  return Pmi2Reply(response, thrid, false).Str("rc", "-1").Str("errmsg", Pmi2Text(message)).Done();
}

}  // namespace dpmix::pmi
