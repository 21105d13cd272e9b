package githubtest

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Messages GitHub answers for app JWT problems.
const (
	msgJWTUndecodable = "A JSON web token could not be decoded"
	msgJWTExpMissing  = "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires"
	msgJWTExpTooFar   = "'Expiration time' claim ('exp') is too far in the future"
	msgJWTIatInvalid  = "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued"
	msgJWTIssInvalid  = "'Issuer' claim ('iss') must be an Integer"
	msgNoCredentials  = "Requires authentication"
	msgBadCredentials = "Bad credentials"
	maxJWTLifetime    = 10 * time.Minute
	tokenAlphabet     = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
)

// issuedToken is an installation access token the emulator created.
type issuedToken struct {
	value          string
	installationID int64
	expiresAt      time.Time
	repoIDs        map[int64]bool // nil: every repository of the installation
	permissions    map[string]string
}

// authenticate identifies the caller for a route taking mode. A failure is
// returned as the reply to send (401).
func (s *Server) authenticate(r *http.Request, mode authMode) (principal, *reply) {
	if mode == authNone {
		return principal{}, nil
	}
	credential, present := bearer(r.Header.Get("Authorization"))
	fail := func(message, doc string) (principal, *reply) {
		rep := errorReply(http.StatusUnauthorized, message, doc)
		return principal{}, &rep
	}
	if !present {
		return fail(msgNoCredentials, docRoot)
	}
	if mode == authAppJWT {
		if msg := s.verifyAppJWT(credential); msg != "" {
			return fail(msg, docAccessToken)
		}
		return principal{mode: authAppJWT}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tok := s.tokens[credential]
	if tok == nil || !s.now().Before(tok.expiresAt) {
		return fail(msgBadCredentials, docRoot)
	}
	inst := s.installations[tok.installationID]
	if inst == nil || inst.suspended {
		return fail(msgBadCredentials, docRoot)
	}
	return principal{mode: authInstallationToken, installationID: tok.installationID, token: tok}, nil
}

// bearer extracts the credential of "Bearer X" or "token X".
func bearer(header string) (string, bool) {
	scheme, credential, ok := strings.Cut(strings.TrimSpace(header), " ")
	credential = strings.TrimSpace(credential)
	if !ok || credential == "" {
		return "", false
	}
	switch strings.ToLower(scheme) {
	case "bearer", "token":
		return credential, true
	default:
		return "", false
	}
}

// verifyAppJWT returns "" for a valid app JWT, else GitHub's message.
func (s *Server) verifyAppJWT(raw string) string {
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(raw, claims, func(*jwt.Token) (any, error) { return &s.key.PublicKey, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodRS256.Alg()}),
		jwt.WithoutClaimsValidation(),
	)
	if err != nil {
		return msgJWTUndecodable
	}
	now := s.now()
	iat, ok := numericClaim(claims["iat"])
	if !ok || time.Unix(iat, 0).After(now.Add(s.opts.ClockSkew)) {
		return msgJWTIatInvalid
	}
	exp, ok := numericClaim(claims["exp"])
	if !ok || !time.Unix(exp, 0).After(now) {
		return msgJWTExpMissing
	}
	if time.Unix(exp, 0).After(now.Add(maxJWTLifetime)) {
		return msgJWTExpTooFar
	}
	var iss string
	switch v := claims["iss"].(type) {
	case string:
		iss = v
	case float64:
		if v == float64(int64(v)) {
			iss = strconv.FormatInt(int64(v), 10)
		}
	}
	if iss == "" {
		return msgJWTIssInvalid
	}
	if iss != s.opts.AppID && (s.opts.ClientID == "" || iss != s.opts.ClientID) {
		// Another app's JWT: its signature would not verify on GitHub.
		return msgJWTUndecodable
	}
	return ""
}

func numericClaim(v any) (int64, bool) {
	f, ok := v.(float64)
	if !ok || f != float64(int64(f)) {
		return 0, false
	}
	return int64(f), true
}

// accessTokenRequest is the optional body of the access-token route.
type accessTokenRequest struct {
	Repositories  []string          `json:"repositories"`
	RepositoryIDs []int64           `json:"repository_ids"`
	Permissions   map[string]string `json:"permissions"`
}

func (s *Server) createInstallationToken(r *http.Request, _ principal) reply {
	id, err := strconv.ParseInt(r.PathValue("installation_id"), 10, 64)
	if err != nil {
		return notFound()
	}
	var req accessTokenRequest
	if !decodeBody(r, &req, true) {
		return badJSON(docAccessToken)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tok, rep := s.issueTokenLocked(id, req)
	if rep != nil {
		return *rep
	}
	body := map[string]any{
		"token":                tok.value,
		"expires_at":           timestamp(tok.expiresAt),
		"permissions":          tok.permissions,
		"repository_selection": "all",
	}
	if tok.repoIDs != nil {
		body["repository_selection"] = "selected"
		repos := []map[string]any{}
		for _, r := range s.sortedRepos() {
			if tok.repoIDs[r.id] {
				repos = append(repos, s.repoJSON(r, s.opts.HTMLURL))
			}
		}
		body["repositories"] = repos
	}
	return jsonReply(http.StatusCreated, body)
}

var permissionRank = map[string]int{"read": 1, "write": 2, "admin": 3}

// issueTokenLocked creates a token for installation id; s.mu must be held.
func (s *Server) issueTokenLocked(id int64, req accessTokenRequest) (*issuedToken, *reply) {
	inst := s.installations[id]
	if inst == nil {
		rep := notFound()
		return nil, &rep
	}
	if inst.suspended {
		rep := errorReply(http.StatusForbidden, "This installation has been suspended", docAccessToken)
		return nil, &rep
	}
	unprocessable := func(message string) (*issuedToken, *reply) {
		rep := errorReply(http.StatusUnprocessableEntity, message, docAccessToken)
		return nil, &rep
	}
	tok := &issuedToken{installationID: id, permissions: inst.permissions}
	if len(req.Repositories) > 0 || len(req.RepositoryIDs) > 0 {
		tok.repoIDs = make(map[int64]bool)
		for _, name := range req.Repositories {
			r := s.repos[strings.ToLower(inst.account+"/"+name)]
			if r == nil {
				r = s.repos[strings.ToLower(name)]
			}
			if r == nil || r.installationID != id {
				return unprocessable("There is at least one repository that does not exist or is not accessible to the parent installation.")
			}
			tok.repoIDs[r.id] = true
		}
		for _, rid := range req.RepositoryIDs {
			r := s.reposByID[rid]
			if r == nil || r.installationID != id {
				return unprocessable("There is at least one repository that does not exist or is not accessible to the parent installation.")
			}
			tok.repoIDs[rid] = true
		}
	}
	if len(req.Permissions) > 0 {
		for name, level := range req.Permissions {
			granted, ok := inst.permissions[name]
			if !ok || permissionRank[level] == 0 || permissionRank[level] > permissionRank[granted] {
				return unprocessable("The permissions requested are not granted to this installation.")
			}
		}
		tok.permissions = req.Permissions
	}
	value, err := randomToken()
	if err != nil {
		rep := errorReply(http.StatusInternalServerError, "Server Error", docRoot)
		return nil, &rep
	}
	tok.value = value
	tok.expiresAt = s.now().Add(s.opts.TokenTTL).Truncate(time.Second)
	s.tokens[value] = tok
	s.notify()
	return tok, nil
}

// IssueToken creates an installation token directly, without a JWT: a
// shortcut for tests of code that only consumes tokens.
func (s *Server) IssueToken(installationID int64) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tok, rep := s.issueTokenLocked(installationID, accessTokenRequest{})
	if rep != nil {
		return "", time.Time{}, fmt.Errorf("githubtest: issuing a token for installation %d: HTTP %d", installationID, rep.status)
	}
	return tok.value, tok.expiresAt, nil
}

// RevokeTokens invalidates every token of installationID (GitHub does so
// when an installation is deleted or its permissions change).
func (s *Server) RevokeTokens(installationID int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for v, tok := range s.tokens {
		if tok.installationID == installationID {
			delete(s.tokens, v)
		}
	}
	s.notify()
}

func randomToken() (string, error) {
	var b strings.Builder
	b.WriteString("ghs_")
	n := big.NewInt(int64(len(tokenAlphabet)))
	for range 36 {
		i, err := rand.Int(rand.Reader, n)
		if err != nil {
			return "", errors.New("random source failed")
		}
		b.WriteByte(tokenAlphabet[i.Int64()])
	}
	return b.String(), nil
}

// repoFor returns the repository of the request's {owner}/{repo} when p's
// token may see it, else a 404 reply; s.mu must be held.
// repoWith is repoFor followed by the permission check every repository
// route makes (GitHub answers 404 before 403).
func (s *Server) repoWith(r *http.Request, p principal, permission, level string) (*repository, *reply) {
	repo, rep := s.repoFor(r, p)
	if rep != nil {
		return nil, rep
	}
	if rep := s.permit(p, permission, level); rep != nil {
		return nil, rep
	}
	return repo, nil
}

func (s *Server) repoFor(r *http.Request, p principal) (*repository, *reply) {
	repo := s.repos[strings.ToLower(r.PathValue("owner")+"/"+r.PathValue("repo"))]
	if repo == nil || p.token == nil || repo.installationID != p.installationID ||
		(p.token.repoIDs != nil && !p.token.repoIDs[repo.id]) {
		rep := notFound()
		return nil, &rep
	}
	return repo, nil
}

func (s *Server) sortedRepos() []*repository {
	repos := make([]*repository, 0, len(s.reposByID))
	for _, r := range s.reposByID {
		repos = append(repos, r)
	}
	slices.SortFunc(repos, func(a, b *repository) int { return cmp.Compare(a.id, b.id) })
	return repos
}
