package api

import (
	"net/http"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Lifecycle webhooks (pkg/services/webhooks, docs/webhooks.md), served
// over the service's own interface (Options.Webhooks):
//
//	POST   /v1/webhooks                                     register (the answer holds the secret, once)
//	GET    /v1/webhooks                                     list
//	GET    /v1/webhooks/{id}                                get
//	PATCH  /v1/webhooks/{id}                                update, enable, disable
//	DELETE /v1/webhooks/{id}                                delete
//	GET    /v1/webhooks/{id}/deliveries?limit=              the delivery log, newest first
//	POST   /v1/webhooks/{id}/deliveries/{delivery}/redeliver queue a delivery again

func (s *server) routeWebhooks(mux *http.ServeMux) {
	if s.opt.Webhooks == nil {
		return
	}
	mux.HandleFunc("POST /v1/webhooks", s.createWebhook)
	mux.HandleFunc("GET /v1/webhooks", s.listWebhooks)
	mux.HandleFunc("GET /v1/webhooks/{id}", s.getWebhook)
	mux.HandleFunc("PATCH /v1/webhooks/{id}", s.updateWebhook)
	mux.HandleFunc("DELETE /v1/webhooks/{id}", s.deleteWebhook)
	mux.HandleFunc("GET /v1/webhooks/{id}/deliveries", s.listDeliveries)
	mux.HandleFunc("POST /v1/webhooks/{id}/deliveries/{delivery}/redeliver", s.redeliver)
}

func (s *server) createWebhook(w http.ResponseWriter, r *http.Request) {
	var req apitypes.WebhookCreateRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	hook, err := s.opt.Webhooks.CreateWebhook(r.Context(), req)
	s.reply(w, r, http.StatusCreated, hook, err)
}

func (s *server) listWebhooks(w http.ResponseWriter, r *http.Request) {
	l, err := s.opt.Webhooks.ListWebhooks(r.Context())
	s.reply(w, r, http.StatusOK, l, err)
}

func (s *server) getWebhook(w http.ResponseWriter, r *http.Request) {
	hook, err := s.opt.Webhooks.GetWebhook(r.Context(), r.PathValue("id"))
	s.reply(w, r, http.StatusOK, hook, err)
}

func (s *server) updateWebhook(w http.ResponseWriter, r *http.Request) {
	var req apitypes.WebhookUpdateRequest
	if err := s.decodeFor(w, r, &req, "webhook_id", &req.ID); err != nil {
		s.writeError(w, r, err)
		return
	}
	hook, err := s.opt.Webhooks.UpdateWebhook(r.Context(), req)
	s.reply(w, r, http.StatusOK, hook, err)
}

func (s *server) deleteWebhook(w http.ResponseWriter, r *http.Request) {
	if err := s.opt.Webhooks.DeleteWebhook(r.Context(), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) listDeliveries(w http.ResponseWriter, r *http.Request) {
	limit, err := queryInt(r, "limit", 32)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	l, err := s.opt.Webhooks.ListDeliveries(r.Context(), r.PathValue("id"), int(limit))
	s.reply(w, r, http.StatusOK, l, err)
}

func (s *server) redeliver(w http.ResponseWriter, r *http.Request) {
	d, err := s.opt.Webhooks.Redeliver(r.Context(), r.PathValue("id"), r.PathValue("delivery"))
	s.reply(w, r, http.StatusAccepted, d, err)
}
