// Package policyservice serves sluice.v1.PolicyService: Apply, Get, List,
// Delete and Watch over a policystore.Store, behind bearer-token or mTLS
// authentication (Authenticator).
//
// Mount it on its own listener, or on the decision API's gRPC server: the
// Authenticator's interceptors guard PolicyService methods only.
//
//	auth, err := policyservice.NewAuthenticator(policyservice.AuthConfig{Tokens: tokens, Logger: log})
//	gs := grpc.NewServer(append(auth.ServerOptions(), grpc.Creds(creds))...)
//	policyservice.New(store, policyservice.Options{Logger: log}).Register(gs)
//
// To bound what clients with credentials can have in flight (Limits), add
// the Service's TapHandle to the server's tap after the Authenticator's,
// and serve it with its Codec, which sends the answers it shares among
// clients as they were encoded once (the server package does both).
package policyservice
