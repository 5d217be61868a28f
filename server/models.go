package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kiln-llm/kiln/catalog"
	"github.com/kiln-llm/kiln/hub"
)

// ModelStore is the models of this machine that Ollama's model routes
// answer from: /api/tags lists them, /api/show describes any of them,
// /api/pull downloads into the Hugging Face cache and /api/delete removes
// from it. cmd/kiln's is a *catalog.Catalog. Its methods never take a
// path: names from requests reach only the stores.
type ModelStore interface {
	List() ([]*catalog.Model, []error)
	Find(name string) (*catalog.Model, error)
	Pull(ctx context.Context, name string, progress func(hub.Event)) (*catalog.Model, *hub.Pulled, error)
	Remove(name string) (*catalog.Model, int64, error)
}

// ollamaName is a model's name as Ollama's API writes names: with a tag.
func ollamaName(name string) string {
	if strings.LastIndex(name, ":") > strings.LastIndex(name, "/") {
		return name
	}
	return name + ":latest"
}

// findModel returns the served model (nil for the embedded demo) when name
// names it, else the store's model of that name.
func (s *Server) findModel(name string) (*catalog.Model, string, error) {
	if s.checkModel(name) == nil {
		return s.opts.Served, s.opts.ModelName, nil
	}
	if s.opts.Models == nil {
		return nil, "", s.checkModel(name)
	}
	m, err := s.opts.Models.Find(name)
	if base, ok := strings.CutSuffix(name, ":latest"); err != nil && ok {
		m, err = s.opts.Models.Find(base) // a hub checkpoint, as /api/tags names it
	}
	if err != nil {
		var nf *catalog.NotFoundError
		if errors.As(err, &nf) {
			return nil, "", notFound("model_not_found", "model %q not found; this server serves %q, and `kiln ls` lists the models it can name", name, s.opts.ModelName)
		}
		return nil, "", badRequest("model", "%v", err)
	}
	return m, m.Name, nil
}

// ollamaDetails are a model's "details" in Ollama's answers.
func ollamaDetails(m *catalog.Model, in *catalog.Info) map[string]any {
	if m == nil { // the embedded demo model
		return map[string]any{"parent_model": "", "format": "safetensors", "family": "qwen3", "families": []string{"qwen3"},
			"parameter_size": "6M", "quantization_level": "BF16"}
	}
	d := map[string]any{"parent_model": "", "format": m.Format, "family": "", "families": []string{},
		"parameter_size": "", "quantization_level": m.Quant}
	if in != nil {
		d["family"], d["families"], d["parameter_size"] = in.Family, []string{in.Family}, catalog.ParamSize(in.Params)
	}
	return d
}

// describe reads what Ollama's answers say of a model; nil when its files
// cannot be read (it is still listed, with what the catalog knows).
func (s *Server) describe(m *catalog.Model) *catalog.Info {
	if m == nil {
		return nil
	}
	in, err := catalog.Describe(m)
	if err != nil {
		s.log.Debug("describing a model", "model", m.Name, "err", err)
		return nil
	}
	return in
}

func (s *Server) ollamaTags(w http.ResponseWriter, r *http.Request) {
	entry := func(m *catalog.Model, name string) map[string]any {
		e := map[string]any{"name": ollamaName(name), "model": ollamaName(name), "modified_at": s.started.UTC().Format(time.RFC3339Nano),
			"size": 0, "digest": "", "details": ollamaDetails(m, s.describe(m))}
		if m != nil {
			e["modified_at"], e["size"], e["digest"] = m.Modified.UTC().Format(time.RFC3339Nano), m.Size, m.Digest
		}
		return e
	}
	models := []any{entry(s.opts.Served, s.opts.ModelName)}
	if s.opts.Models != nil {
		list, errs := s.opts.Models.List()
		for _, err := range errs {
			s.log.Debug("listing models", "err", err)
		}
		for _, m := range list {
			if s.opts.Served == nil || m.Path != s.opts.Served.Path {
				models = append(models, entry(m, m.Name))
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

// modelRequest is the body of Ollama's model routes.
type modelRequest struct {
	Model  string `json:"model"`
	Name   string `json:"name"`   // older clients
	Stream *bool  `json:"stream"` // /api/pull
}

// decodeModelRequest reads a model route's body; it names a model.
func (s *Server) decodeModelRequest(w http.ResponseWriter, r *http.Request) (*modelRequest, error) {
	var req modelRequest
	if err := decodeBody(w, r, s.opts.MaxBodyBytes, &req); err != nil {
		return nil, err
	}
	if req.Model == "" {
		req.Model = req.Name
	}
	if req.Model == "" {
		return nil, badRequest("model", "model is required")
	}
	return &req, nil
}

func (s *Server) ollamaShow(w http.ResponseWriter, r *http.Request) error {
	req, err := s.decodeModelRequest(w, r)
	if err != nil {
		return err
	}
	m, _, err := s.findModel(req.Model)
	if err != nil {
		return err
	}
	in := s.describe(m)
	info := map[string]any{"general.architecture": "qwen3"}
	family := "qwen3"
	caps := []string{"completion", "tools", "thinking"}
	template, modified := "", s.started
	if in != nil {
		modified, template, caps = m.Modified, in.Template, []string{"completion"}
		if strings.Contains(in.Template, "tools") {
			caps = append(caps, "tools")
		}
		if strings.Contains(in.Template, "<think>") || strings.Contains(in.Template, "enable_thinking") {
			caps = append(caps, "thinking")
		}
		a := in.Family
		family = a
		info = map[string]any{"general.architecture": a, "general.parameter_count": in.Params, "general.file_type": m.Quant,
			a + ".context_length": in.Context, a + ".embedding_length": in.Hidden, a + ".block_count": in.Layers,
			a + ".attention.head_count": in.Heads, a + ".attention.head_count_kv": in.KVHeads, a + ".vocab_size": in.Vocab}
		if in.Experts > 0 {
			info[a+".expert_count"], info[a+".expert_used_count"] = in.Experts, in.ExpertsUsed
		}
	}
	if m == s.opts.Served {
		// What a request can have, not what the model was trained for.
		info[family+".context_length"] = s.contextLength()
	}
	writeJSON(w, http.StatusOK, map[string]any{"modelfile": "", "parameters": "", "template": template,
		"details": ollamaDetails(m, in), "model_info": info, "capabilities": caps,
		"modified_at": modified.UTC().Format(time.RFC3339Nano)})
	return nil
}

// pullError is what a client sees of a failed pull: the hub's "not found"
// and "forbidden" pass through, the hub's other failures are a bad gateway.
func pullError(err error) error {
	var he *hub.HTTPError
	switch {
	case errors.As(err, &he) && (he.Status == http.StatusNotFound || he.Status == http.StatusUnauthorized):
		return notFound("model_not_found", "%v", err)
	case errors.As(err, &he) && he.Status == http.StatusForbidden:
		return newAPIError(http.StatusForbidden, "permission_error", "", "", "%v", err)
	case errors.As(err, &he), errors.Is(err, hub.ErrOffline):
		return newAPIError(http.StatusBadGateway, "server_error", "", "", "%v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return badRequest("model", "%v", err)
}

// ollamaPull downloads a model into the Hugging Face cache, streaming
// Ollama's progress objects ({"status", "digest", "total", "completed"})
// unless stream is false.
func (s *Server) ollamaPull(w http.ResponseWriter, r *http.Request) error {
	req, err := s.decodeModelRequest(w, r)
	if err != nil {
		return err
	}
	if s.opts.Models == nil {
		return newAPIError(http.StatusNotImplemented, "invalid_request_error", "", "", "this server has no model store to pull into")
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if req.Stream != nil && !*req.Stream {
		if _, _, err := s.opts.Models.Pull(ctx, req.Model, nil); err != nil {
			return pullError(err)
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "success"})
		return nil
	}
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sw := &streamWriter{w: w, rc: http.NewResponseController(w), timeout: s.opts.WriteTimeout, cancel: cancel}
	var mu sync.Mutex
	last := map[string]time.Time{}
	line := func(v any) {
		mu.Lock()
		defer mu.Unlock()
		sw.line(v)
	}
	line(map[string]string{"status": "pulling manifest"})
	_, _, err = s.opts.Models.Pull(ctx, req.Model, func(e hub.Event) {
		mu.Lock()
		if e.State == hub.Downloading && time.Since(last[e.File]) < 250*time.Millisecond {
			mu.Unlock()
			return
		}
		last[e.File] = time.Now()
		mu.Unlock()
		digest := e.Digest
		if len(digest) == 64 {
			digest = "sha256:" + digest
		}
		line(map[string]any{"status": "pulling " + e.File, "digest": digest, "total": e.Size, "completed": e.Done})
	})
	if err != nil {
		line(map[string]string{"error": asAPIError(pullError(err)).Message})
		return err
	}
	for _, st := range []string{"verifying sha256 digest", "writing manifest", "success"} {
		line(map[string]string{"status": st})
	}
	return sw.err
}

// ollamaDelete removes a model from the Hugging Face cache; the served
// model and Ollama's own models are refused.
func (s *Server) ollamaDelete(w http.ResponseWriter, r *http.Request) error {
	req, err := s.decodeModelRequest(w, r)
	if err != nil {
		return err
	}
	m, name, err := s.findModel(req.Model)
	if err != nil {
		return err
	}
	if m == nil || m == s.opts.Served || s.opts.Served != nil && m.Path == s.opts.Served.Path {
		return newAPIError(http.StatusConflict, "invalid_request_error", "model_in_use", "model",
			"%s is the model this server serves; stop the server before deleting it", name)
	}
	if _, _, err := s.opts.Models.Remove(m.Ref()); err != nil {
		return badRequest("model", "%v", err)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}
