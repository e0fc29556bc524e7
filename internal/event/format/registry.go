package format

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/billing/ledger/internal/event"
)

// RegistryOptions connect to a Confluent-compatible schema registry.
type RegistryOptions struct {
	URL      string      // base URL (http or https)
	Username string      // basic auth user ("": none)
	Password string      // basic auth password
	TLS      *tls.Config // for https; nil: the system roots
	// Subject is the subject every schema id of a record must belong to
	// (TopicNameStrategy: <topic>-value); "" checks nothing.
	Subject string
	// Timeout bounds one request (default 5 s).
	Timeout time.Duration
	// CacheSize bounds the compiled schemas kept (default 1000); the
	// schemas one poll needs are kept whatever the bound.
	CacheSize int
}

// UnavailableError says that the registry did not answer (a network
// error, a timeout, a status other than 404): the record is not at fault
// and must be decoded again once the registry answers, never dead-lettered
// for it.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string { return "schema registry unavailable: " + e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// IsUnavailable reports whether err is an *UnavailableError.
func IsUnavailable(err error) bool {
	var u *UnavailableError
	return errors.As(err, &u)
}

// registry fetches schemas by id and keeps them compiled, with a bound.
type registry struct {
	cl      *sr.Client
	subject string
	timeout time.Duration
	limit   int
	// missingTTL: missingTTL, shorter in tests.
	missingTTL time.Duration
	// compile turns a schema (with its references resolved through the
	// client) into the format's decoder of record bodies.
	compile func(ctx context.Context, cl *sr.Client, s sr.Schema) (bodyDecoder, error)

	mu    sync.Mutex
	gen   uint64 // the current Prepare's generation: its entries are not evicted
	cache map[int]*cached
	order []int // insertion order, for eviction
}

type cached struct {
	body bodyDecoder
	err  *event.DecodeError // permanent: unknown id, another subject, a schema that does not compile
	gen  uint64
	// missing: the registry answered 404, at; asked again after
	// missingTTL (a replica of the registry may not hold a new id yet).
	missing bool
	at      time.Time
}

// missingTTL is how long a 404 for a schema id is believed.
const missingTTL = 30 * time.Second

// bodyDecoder decodes the bytes after the wire-format header.
type bodyDecoder interface {
	decode(b []byte) (any, error)
}

func newRegistry(o RegistryOptions, compile func(context.Context, *sr.Client, sr.Schema) (bodyDecoder, error)) (*registry, error) {
	if o.URL == "" {
		return nil, errors.New("format: this format needs a schema registry URL")
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.CacheSize <= 0 {
		o.CacheSize = 1000
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if o.TLS != nil {
		tr.TLSClientConfig = o.TLS
	}
	opts := []sr.ClientOpt{sr.URLs(o.URL), sr.HTTPClient(&http.Client{Transport: tr, Timeout: o.Timeout}), sr.UserAgent("billing-ledger")}
	if o.Username != "" {
		opts = append(opts, sr.BasicAuth(o.Username, o.Password))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("format: schema registry: %w", err)
	}
	return &registry{cl: cl, subject: o.Subject, timeout: o.Timeout, limit: o.CacheSize, compile: compile, cache: map[int]*cached{}, missingTTL: missingTTL}, nil
}

// classify tells a registry's answer that the record is at fault for (404:
// no such schema) from one it is not.
func classify(err error, what string) error {
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
		return &notFound{&event.DecodeError{Reason: event.ReasonUnknownSchema, Detail: what + ": the registry has none (" + re.Error() + ")"}}
	}
	return &UnavailableError{Err: err}
}

// notFound is a 404's dead letter, told apart so that it is asked again.
type notFound struct{ *event.DecodeError }

func (n *notFound) Unwrap() error { return n.DecodeError }

// lookup returns the compiled schema id, fetching and compiling it once.
// Errors: *event.DecodeError (permanent, cached) or *UnavailableError (not
// cached: the next lookup asks again).
func (r *registry) lookup(ctx context.Context, id int) (bodyDecoder, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.cache[id]; ok && !(c.missing && time.Since(c.at) > r.missingTTL) {
		c.gen = r.gen
		if c.err != nil {
			return nil, c.err
		}
		return c.body, nil
	}
	body, err := r.fetch(ctx, id)
	var de *event.DecodeError
	if err != nil && !errors.As(err, &de) {
		return nil, err
	}
	if _, again := r.cache[id]; !again {
		r.evictLocked()
		r.order = append(r.order, id)
	}
	var nf *notFound
	r.cache[id] = &cached{body: body, err: de, gen: r.gen, missing: errors.As(err, &nf), at: time.Now()}
	if de != nil {
		return nil, de
	}
	return body, nil
}

func (r *registry) fetch(ctx context.Context, id int) (bodyDecoder, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	what := fmt.Sprintf("schema id %d", id)
	s, err := r.cl.SchemaByID(ctx, id)
	if err != nil {
		return nil, classify(err, what)
	}
	if r.subject != "" {
		subjects, err := r.cl.SubjectsByID(ctx, id)
		if err != nil {
			return nil, classify(err, what)
		}
		if !slices.Contains(subjects, r.subject) {
			return nil, &event.DecodeError{Reason: event.ReasonUnknownSchema,
				Detail: fmt.Sprintf("%s is of subject %s, not %s", what, strings.Join(subjects, ", "), r.subject)}
		}
	}
	body, err := r.compile(ctx, r.cl, s)
	if err != nil {
		var de *event.DecodeError
		if errors.As(err, &de) || IsUnavailable(err) {
			return nil, err
		}
		return nil, &event.DecodeError{Reason: event.ReasonUnknownSchema, Detail: fmt.Sprintf("%s does not compile: %v", what, err)}
	}
	return body, nil
}

// evictLocked drops the oldest entries beyond the bound, except those the
// current Prepare needs.
func (r *registry) evictLocked() {
	for i := 0; len(r.cache) >= r.limit && i < len(r.order); {
		id := r.order[i]
		if c := r.cache[id]; c != nil && c.gen == r.gen {
			i++
			continue
		}
		delete(r.cache, id)
		r.order = slices.Delete(r.order, i, i+1)
	}
}

// begin starts a Prepare: the entries it touches are kept until the next.
func (r *registry) begin() {
	r.mu.Lock()
	r.gen++
	r.mu.Unlock()
}

// refs fetches the schemas s references, depth first, calling add for each
// (a reference's own references first), each subject/version once.
func refs(ctx context.Context, cl *sr.Client, s sr.Schema, seen map[string]bool, depth int, add func(ref sr.SchemaReference, s sr.Schema) error) error {
	if depth > 16 {
		return errors.New("references nested deeper than 16")
	}
	for _, ref := range s.References {
		key := fmt.Sprintf("%s/%d", ref.Subject, ref.Version)
		if seen[key] {
			continue
		}
		seen[key] = true
		ss, err := cl.SchemaByVersion(ctx, ref.Subject, ref.Version)
		if err != nil {
			return classify(err, "reference "+key)
		}
		if err := refs(ctx, cl, ss.Schema, seen, depth+1, add); err != nil {
			return err
		}
		if err := add(ref, ss.Schema); err != nil {
			return err
		}
	}
	return nil
}

// PingRegistry asks the registry of o for its subjects: nil when it
// answers, an *UnavailableError when it does not (what the service would
// wait for).
func PingRegistry(ctx context.Context, o RegistryOptions) error {
	r, err := newRegistry(o, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	if _, err := r.cl.Subjects(ctx); err != nil {
		return &UnavailableError{Err: err}
	}
	return nil
}
