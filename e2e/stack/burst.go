package stack

import (
	"context"
	"io"
	"net/http"
	"sync"
)

// BurstAnswer is one request of a Burst as its client saw it.
type BurstAnswer struct {
	Status int
	Body   []byte // the whole body, when the Burst keeps bodies
	Err    error
}

// Burst sends n requests at once (one goroutine each), request i made by
// send with ctx, meant to be held by their upstream after their first
// chunk (a UsageUpstream gate). Once every request is decided (its client
// has its status: the admitted ones are then all streaming at the same
// time) it calls decided (if not nil) with the answers so far, then
// release, and returns the answers once every body is read (kept when
// keepBodies).
func Burst(ctx context.Context, n int, send func(ctx context.Context, i int) (*http.Response, error),
	keepBodies bool, decided func([]BurstAnswer), release func()) []BurstAnswer {
	out := make([]BurstAnswer, n)
	var heads, bodies sync.WaitGroup
	for i := range n {
		heads.Add(1)
		bodies.Add(1)
		go func() {
			defer bodies.Done()
			resp, err := send(ctx, i)
			if err != nil {
				out[i].Err = err
				heads.Done()
				return
			}
			out[i].Status = resp.StatusCode
			heads.Done()
			if keepBodies {
				out[i].Body, out[i].Err = io.ReadAll(resp.Body)
			} else {
				_, out[i].Err = io.Copy(io.Discard, resp.Body)
			}
			resp.Body.Close()
		}()
	}
	heads.Wait()
	if decided != nil {
		decided(out)
	}
	release()
	bodies.Wait()
	return out
}
