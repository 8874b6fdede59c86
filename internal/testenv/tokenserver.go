package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Token auth as the distribution registry speaks it: the registry trusts
// the certificate of the key tokens are signed with (rootcertbundle), and
// a token names the repositories and actions it grants. TokensIssued counts
// what the server handed out, so a test can tell token auth was used.

const (
	tokenService = "sandboxd-test-registry"
	tokenIssuer  = "sandboxd-test-token-server"
)

// startTokenServer serves /token over TLS (the registry's own certificate)
// on a held loopback listener and returns the registry's auth section.
func (r *Registry) startTokenServer(t testing.TB, dir string, certPEM, keyPEM []byte) string {
	t.Helper()
	signKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: tokenIssuer},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
	}
	signDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &signKey.PublicKey, signKey)
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "token-signer.pem")
	if err := os.WriteFile(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: signDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		user, pass, ok := req.BasicAuth()
		if !ok || user != r.Username || pass != r.Password {
			http.Error(w, `{"details":"bad credentials"}`, http.StatusUnauthorized)
			return
		}
		if req.URL.Query().Get("service") != tokenService {
			http.Error(w, "unknown service", http.StatusBadRequest)
			return
		}
		var access []map[string]any
		for _, scope := range req.URL.Query()["scope"] {
			// repository:NAME:ACTIONS (NAME may hold no colon here).
			parts := strings.Split(scope, ":")
			if len(parts) != 3 {
				continue
			}
			access = append(access, map[string]any{"type": parts[0], "name": parts[1], "actions": strings.Split(parts[2], ",")})
		}
		tok, err := signToken(signKey, signDER, map[string]any{
			"iss": tokenIssuer, "sub": user, "aud": tokenService,
			"exp": time.Now().Add(5 * time.Minute).Unix(), "nbf": time.Now().Add(-time.Minute).Unix(), "iat": time.Now().Unix(),
			"jti": RandHex(8), "access": access,
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		r.TokensIssued.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"token": tok, "access_token": tok, "expires_in": 300})
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	// The realm names localhost, not 127.0.0.1: go-containerregistry
	// refuses token realms at private or loopback IP literals (a guard
	// against a registry steering clients at internal services).
	return fmt.Sprintf("auth:\n  token:\n    realm: https://localhost:%d/token\n    service: %s\n    issuer: %s\n    rootcertbundle: %s\n",
		l.Addr().(*net.TCPAddr).Port, tokenService, tokenIssuer, bundle)
}

// signToken makes an ES256 JWT whose x5c header carries the signing
// certificate, which the registry verifies against its rootcertbundle.
func signToken(key *ecdsa.PrivateKey, certDER []byte, claims map[string]any) (string, error) {
	header, err := json.Marshal(map[string]any{"alg": "ES256", "typ": "JWT", "x5c": []string{base64.StdEncoding.EncodeToString(certDER)}})
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	signing := base64.RawURLEncoding.EncodeToString(header) + "." + base64.RawURLEncoding.EncodeToString(payload)
	sum := sha256.Sum256([]byte(signing))
	rr, ss, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		return "", err
	}
	sig := make([]byte, 64)
	rr.FillBytes(sig[:32])
	ss.FillBytes(sig[32:])
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}
