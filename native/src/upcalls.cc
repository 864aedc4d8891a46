// pmix_server_module_t: each upcall names what it passes (Args) and how libpmix is answered (its
// reply kind), and posts itself to JavaScript. Nothing here decides anything.
#include "upcalls.h"

#include <pmix.h>

#include <cstring>

#include "delivery.h"
#include "upcall.h"

namespace dpmix {
namespace upcalls {

namespace {

using delivery::Post;

pmix_status_t client_connected2(const pmix_proc_t *proc, void *, pmix_info_t info[], size_t ninfo,
                                pmix_op_cbfunc_t cbfunc, void *cbdata) {
  pmix_status_t rc =
      Post(new OpReply("clientConnected", Args().Proc("proc", proc).Infos("info", info, ninfo), cbfunc, cbdata));
  // Before PMIx 5.0.8 libpmix passes no callback: the host is told, but cannot hold the client.
  return (rc == PMIX_SUCCESS && cbfunc == nullptr) ? PMIX_OPERATION_SUCCEEDED : rc;
}

pmix_status_t client_finalized(const pmix_proc_t *proc, void *, pmix_op_cbfunc_t cbfunc, void *cbdata) {
  return Post(new OpReply("clientFinalized", Args().Proc("proc", proc), cbfunc, cbdata));
}

pmix_status_t abort_fn(const pmix_proc_t *proc, void *, int status, const char msg[], pmix_proc_t procs[],
                       size_t nprocs, pmix_op_cbfunc_t cbfunc, void *cbdata) {
  return Post(new OpReply("abort",
                          Args()
                              .Proc("proc", proc)
                              .Number("status", status)
                              .String("message", msg ? msg : "")
                              .Procs("procs", procs, nprocs),
                          cbfunc, cbdata));
}

pmix_status_t fence_nb(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo, char *data,
                       size_t ndata, pmix_modex_cbfunc_t cbfunc, void *cbdata) {
  return Post(new ModexReply("fence",
                             Args().Procs("procs", procs, nprocs).Infos("info", info, ninfo).Bytes("data", data, ndata),
                             cbfunc, cbdata));
}

pmix_status_t direct_modex(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo, pmix_modex_cbfunc_t cbfunc,
                           void *cbdata) {
  return Post(new ModexReply("directModex", Args().Proc("proc", proc).Infos("info", info, ninfo), cbfunc, cbdata));
}

pmix_status_t publish(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo, pmix_op_cbfunc_t cbfunc,
                      void *cbdata) {
  return Post(new OpReply("publish", Args().Proc("proc", proc).Infos("info", info, ninfo), cbfunc, cbdata));
}

pmix_status_t lookup(const pmix_proc_t *proc, char **keys, const pmix_info_t info[], size_t ninfo,
                     pmix_lookup_cbfunc_t cbfunc, void *cbdata) {
  return Post(new LookupReply("lookup", Args().Proc("proc", proc).Strings("keys", keys).Infos("info", info, ninfo),
                              cbfunc, cbdata));
}

pmix_status_t unpublish(const pmix_proc_t *proc, char **keys, const pmix_info_t info[], size_t ninfo,
                        pmix_op_cbfunc_t cbfunc, void *cbdata) {
  return Post(new OpReply("unpublish", Args().Proc("proc", proc).Strings("keys", keys).Infos("info", info, ninfo),
                          cbfunc, cbdata));
}

pmix_status_t spawn(const pmix_proc_t *proc, const pmix_info_t job_info[], size_t ninfo, const pmix_app_t apps[],
                    size_t napps, pmix_spawn_cbfunc_t cbfunc, void *cbdata) {
  return Post(new SpawnReply(
      "spawn", Args().Proc("proc", proc).Infos("jobInfo", job_info, ninfo).Apps("apps", apps, napps), cbfunc, cbdata));
}

pmix_status_t connect(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo,
                      pmix_op_cbfunc_t cbfunc, void *cbdata) {
  return Post(new OpReply("connect", Args().Procs("procs", procs, nprocs).Infos("info", info, ninfo), cbfunc, cbdata));
}

pmix_status_t disconnect(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo,
                         pmix_op_cbfunc_t cbfunc, void *cbdata) {
  return Post(
      new OpReply("disconnect", Args().Procs("procs", procs, nprocs).Infos("info", info, ninfo), cbfunc, cbdata));
}

pmix_status_t register_events(pmix_status_t *codes, size_t ncodes, const pmix_info_t info[], size_t ninfo,
                              pmix_op_cbfunc_t cbfunc, void *cbdata) {
  return Post(
      new OpReply("registerEvents", Args().Numbers("codes", codes, ncodes).Infos("info", info, ninfo), cbfunc, cbdata));
}

pmix_status_t deregister_events(pmix_status_t *codes, size_t ncodes, pmix_op_cbfunc_t cbfunc, void *cbdata) {
  return Post(new OpReply("deregisterEvents", Args().Numbers("codes", codes, ncodes).Infos("info", nullptr, 0), cbfunc,
                          cbdata));
}

pmix_status_t notify_event(pmix_status_t code, const pmix_proc_t *source, pmix_data_range_t range, pmix_info_t info[],
                           size_t ninfo, pmix_op_cbfunc_t cbfunc, void *cbdata) {
  return Post(new OpReply(
      "notifyEvent",
      Args().Number("status", code).Proc("source", source).Number("range", range).Infos("info", info, ninfo), cbfunc,
      cbdata));
}

pmix_status_t query(pmix_proc_t *proct, pmix_query_t *queries, size_t nqueries, pmix_info_cbfunc_t cbfunc,
                    void *cbdata) {
  return Post(new InfoReply("query", Args().Proc("proc", proct).Queries("queries", queries, nqueries), cbfunc, cbdata));
}

// tool_connected and log return void: if the post fails there is nothing more to tell libpmix.
void tool_connected(pmix_info_t *info, size_t ninfo, pmix_tool_connection_cbfunc_t cbfunc, void *cbdata) {
  Post(new ToolReply("toolConnected", Args().Infos("info", info, ninfo), cbfunc, cbdata));
}

void log_fn(const pmix_proc_t *client, const pmix_info_t data[], size_t ndata, const pmix_info_t directives[],
            size_t ndirs, pmix_op_cbfunc_t cbfunc, void *cbdata) {
  Post(new OpReply("log", Args().Proc("proc", client).Infos("data", data, ndata).Infos("directives", directives, ndirs),
                   cbfunc, cbdata));
}

pmix_status_t allocate(const pmix_proc_t *client, pmix_alloc_directive_t directive, const pmix_info_t data[],
                       size_t ndata, pmix_info_cbfunc_t cbfunc, void *cbdata) {
  return Post(new InfoReply("allocate",
                            Args().Proc("proc", client).Infos("directives", data, ndata).Number("directive", directive),
                            cbfunc, cbdata));
}

pmix_status_t job_control(const pmix_proc_t *requestor, const pmix_proc_t targets[], size_t ntargets,
                          const pmix_info_t directives[], size_t ndirs, pmix_info_cbfunc_t cbfunc, void *cbdata) {
  return Post(new InfoReply(
      "jobControl",
      Args().Proc("proc", requestor).Infos("directives", directives, ndirs).Procs("targets", targets, ntargets), cbfunc,
      cbdata));
}

pmix_status_t monitor(const pmix_proc_t *requestor, const pmix_info_t *monitor, pmix_status_t error,
                      const pmix_info_t directives[], size_t ndirs, pmix_info_cbfunc_t cbfunc, void *cbdata) {
  return Post(new InfoReply("monitor",
                            Args()
                                .Proc("proc", requestor)
                                .Infos("directives", directives, ndirs)
                                .OneInfo("monitor", monitor)
                                .Number("error", error),
                            cbfunc, cbdata));
}

pmix_status_t get_credential(const pmix_proc_t *proc, const pmix_info_t directives[], size_t ndirs,
                             pmix_credential_cbfunc_t cbfunc, void *cbdata) {
  return Post(new CredentialReply("getCredential", Args().Proc("proc", proc).Infos("directives", directives, ndirs),
                                  cbfunc, cbdata));
}

pmix_status_t validate_credential(const pmix_proc_t *proc, const pmix_byte_object_t *cred,
                                  const pmix_info_t directives[], size_t ndirs, pmix_validation_cbfunc_t cbfunc,
                                  void *cbdata) {
  return Post(new ValidationReply("validateCredential",
                                  Args()
                                      .Proc("proc", proc)
                                      .Bytes("credential", cred ? cred->bytes : nullptr, cred ? cred->size : 0)
                                      .Infos("directives", directives, ndirs),
                                  cbfunc, cbdata));
}

pmix_status_t iof_pull(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t directives[], size_t ndirs,
                       pmix_iof_channel_t channels, pmix_op_cbfunc_t cbfunc, void *cbdata) {
  return Post(new OpReply(
      "iofPull", Args().Procs("procs", procs, nprocs).Infos("info", directives, ndirs).Number("channels", channels),
      cbfunc, cbdata));
}

pmix_status_t push_stdin(const pmix_proc_t *source, const pmix_proc_t targets[], size_t ntargets,
                         const pmix_info_t directives[], size_t ndirs, const pmix_byte_object_t *bo,
                         pmix_op_cbfunc_t cbfunc, void *cbdata) {
  return Post(new OpReply("pushStdin",
                          Args()
                              .Proc("source", source)
                              .Procs("targets", targets, ntargets)
                              .Infos("directives", directives, ndirs)
                              .Bytes("data", bo ? bo->bytes : nullptr, bo ? bo->size : 0),
                          cbfunc, cbdata));
}

pmix_status_t group(pmix_group_operation_t op, char grp[], const pmix_proc_t procs[], size_t nprocs,
                    const pmix_info_t directives[], size_t ndirs, pmix_info_cbfunc_t cbfunc, void *cbdata) {
  Args args = Args()
                  .String("op", op == PMIX_GROUP_CONSTRUCT  ? "construct"
                                : op == PMIX_GROUP_DESTRUCT ? "destruct"
                                                            : "none")
                  .String("group", grp ? grp : "")
                  .Procs("procs", procs, nprocs)
                  .Infos("directives", directives, ndirs);
  if (op == PMIX_GROUP_DESTRUCT && delivery::IsImmediate("group.destruct")) {
    Post(new InfoReply("group", std::move(args), nullptr, nullptr));
    return PMIX_OPERATION_SUCCEEDED;
  }
  return Post(new InfoReply("group", std::move(args), cbfunc, cbdata));
}

pmix_status_t fabric(const pmix_proc_t *requestor, pmix_fabric_operation_t op, const pmix_info_t directives[],
                     size_t ndirs, pmix_info_cbfunc_t cbfunc, void *cbdata) {
  return Post(new InfoReply("fabric",
                            Args().Proc("proc", requestor).Infos("directives", directives, ndirs).Number("op", op),
                            cbfunc, cbdata));
}

pmix_status_t session_control(const pmix_proc_t *requestor, uint32_t sessionID, const pmix_info_t directives[],
                              size_t ndirs, pmix_info_cbfunc_t cbfunc, void *cbdata) {
  return Post(new InfoReply(
      "sessionControl",
      Args().Proc("proc", requestor).Infos("directives", directives, ndirs).Number("sessionId", sessionID), cbfunc,
      cbdata));
}

// Not an upcall: an event libpmix raises inside the server itself, e.g. PMIX_ERR_LOST_CONNECTION
// when a client's connection drops before it finalized (libpmix tells the host no other way).
// JavaScript only hears about it; the event is marked complete at once, as event handlers do.
void local_event(size_t, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[], size_t ninfo,
                 pmix_info_t *, size_t, pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata) {
  Post(new OpReply("localEvent", Args().Number("status", status).Proc("source", source).Infos("info", info, ninfo),
                   nullptr, nullptr));
  if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, nullptr, 0, nullptr, nullptr, cbdata);
}

bool g_local_events = false;

struct Entry {
  const char *name;
  void (*install)(pmix_server_module_t *);
};

const Entry kEntries[] = {
    {"clientConnected", [](pmix_server_module_t *m) { m->client_connected2 = client_connected2; }},
    {"clientFinalized", [](pmix_server_module_t *m) { m->client_finalized = client_finalized; }},
    {"abort", [](pmix_server_module_t *m) { m->abort = abort_fn; }},
    {"fence", [](pmix_server_module_t *m) { m->fence_nb = fence_nb; }},
    {"directModex", [](pmix_server_module_t *m) { m->direct_modex = direct_modex; }},
    {"publish", [](pmix_server_module_t *m) { m->publish = publish; }},
    {"lookup", [](pmix_server_module_t *m) { m->lookup = lookup; }},
    {"unpublish", [](pmix_server_module_t *m) { m->unpublish = unpublish; }},
    {"spawn", [](pmix_server_module_t *m) { m->spawn = spawn; }},
    {"connect", [](pmix_server_module_t *m) { m->connect = connect; }},
    {"disconnect", [](pmix_server_module_t *m) { m->disconnect = disconnect; }},
    {"registerEvents", [](pmix_server_module_t *m) { m->register_events = register_events; }},
    {"deregisterEvents", [](pmix_server_module_t *m) { m->deregister_events = deregister_events; }},
    {"notifyEvent", [](pmix_server_module_t *m) { m->notify_event = notify_event; }},
    {"query", [](pmix_server_module_t *m) { m->query = query; }},
    {"toolConnected", [](pmix_server_module_t *m) { m->tool_connected = tool_connected; }},
    {"log", [](pmix_server_module_t *m) { m->log = log_fn; }},
    {"allocate", [](pmix_server_module_t *m) { m->allocate = allocate; }},
    {"jobControl", [](pmix_server_module_t *m) { m->job_control = job_control; }},
    {"monitor", [](pmix_server_module_t *m) { m->monitor = monitor; }},
    {"getCredential", [](pmix_server_module_t *m) { m->get_credential = get_credential; }},
    {"validateCredential", [](pmix_server_module_t *m) { m->validate_credential = validate_credential; }},
    {"iofPull", [](pmix_server_module_t *m) { m->iof_pull = iof_pull; }},
    {"pushStdin", [](pmix_server_module_t *m) { m->push_stdin = push_stdin; }},
    {"group", [](pmix_server_module_t *m) { m->group = group; }},
    {"fabric", [](pmix_server_module_t *m) { m->fabric = fabric; }},
    {"sessionControl", [](pmix_server_module_t *m) { m->session_control = session_control; }},
    // Not in pmix_server_module_t: an event handler registered after init (RegisterLocalEvents).
    {"localEvent", [](pmix_server_module_t *) { g_local_events = true; }},
};

}  // namespace

const std::vector<std::string> &Names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto &e : kEntries) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

void Install(Napi::Env env, Napi::Function handler, const std::vector<std::string> &handled,
             const std::vector<std::string> &immediate, pmix_server_module_t *module) {
  g_local_events = false;
  std::memset(module, 0, sizeof *module);
  for (const auto &name : handled) {
    const Entry *found = nullptr;
    for (const auto &e : kEntries)
      if (name == e.name) found = &e;
    if (!found) throw Napi::TypeError::New(env, "unknown PMIx upcall '" + name + "'");
    found->install(module);
  }
  delivery::SetHandler(handler, immediate);
}

pmix_status_t RegisterLocalEvents() {
  if (!g_local_events) return PMIX_SUCCESS;
  pmix_status_t codes[] = {PMIX_ERR_LOST_CONNECTION, PMIX_ERR_UNREACH, PMIX_ERR_PROC_TERM_WO_SYNC};
  // Without a registration callback the call blocks until libpmix's progress thread has
  // registered the handler: brief, and we are on the JavaScript thread, not in an upcall.
  pmix_status_t rc =
      PMIx_Register_event_handler(codes, sizeof codes / sizeof codes[0], nullptr, 0, local_event, nullptr, nullptr);
  return rc < 0 ? rc : PMIX_SUCCESS;  // a non-negative result is the handler's id
}

void Uninstall() { delivery::ResetHandler(); }

void MarkFinalized() { delivery::MarkFinalized(); }

}  // namespace upcalls
}  // namespace dpmix
