/* SPDX-License-Identifier: MIT */
/* The page server's handshake and keys (auth.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef UKVM_HAVE_LIBCRYPTO
#include <dlfcn.h>
#include <pthread.h>

#include <openssl/evp.h>
#include <openssl/opensslv.h>
#endif

#include "base/errors.h"
#include "remote/auth.h"

/* A key file is a line of hex: anything much longer is not one. */
#define AUTH_KEY_FILE_MAX	4096

#ifdef UKVM_HAVE_LIBCRYPTO
/*
 * libcrypto is loaded when first needed, by its soname (the major version
 * of the headers built against): the system's own library, which its
 * security updates keep current, without the extension naming it among
 * its needed libraries (a manylinux wheel may not). Never unloaded.
 */
#define AUTH_STR(x)	#x
#define AUTH_XSTR(x)	AUTH_STR(x)
#define AUTH_LIBCRYPTO	"libcrypto.so." AUTH_XSTR(OPENSSL_VERSION_MAJOR)

static struct {
	const EVP_MD *(*sha256)(void);
	unsigned char *(*hmac)(const EVP_MD *md, const void *key, int key_len,
			       const unsigned char *data, size_t data_len, unsigned char *md_out,
			       unsigned int *md_len);
	int (*memcmp)(const void *a, const void *b, size_t len);
	bool loaded;
} crypto;
static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;

static void auth_load(void)
{
	void *lib = dlopen(AUTH_LIBCRYPTO, RTLD_NOW | RTLD_LOCAL);

	if (!lib)
		return;
	*(void **)&crypto.sha256 = dlsym(lib, "EVP_sha256");
	*(void **)&crypto.hmac = dlsym(lib, "HMAC");
	*(void **)&crypto.memcmp = dlsym(lib, "CRYPTO_memcmp");
	crypto.loaded = crypto.sha256 && crypto.hmac && crypto.memcmp;
}
#endif

bool ukvm_remote_auth_available(void)
{
#ifdef UKVM_HAVE_LIBCRYPTO
	pthread_once(&crypto_once, auth_load);
	return crypto.loaded;
#else
	return false;
#endif
}

static int auth_hex(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

int ukvm_auth_key_parse(const char *text, size_t len, struct ukvm_remote_key *key)
{
	size_t digits = 0, i;

	memset(key, 0, sizeof(*key));
	while (digits < len && auth_hex(text[digits]) >= 0)
		digits++;
	for (i = digits; i < len; i++)
		if (text[i] != '\n' && text[i] != '\r' && text[i] != ' ' && text[i] != '\t')
			return -EINVAL;
	if (digits % 2 || digits < 2 * UKVM_REMOTE_KEY_MIN || digits > 2 * UKVM_REMOTE_KEY_MAX)
		return -EINVAL;
	for (i = 0; i < digits / 2; i++)
		key->bytes[i] = (uint8_t)(auth_hex(text[2 * i]) << 4 | auth_hex(text[2 * i + 1]));
	key->len = (uint32_t)(digits / 2);
	return 0;
}

int ukvm_remote_key_load(const char *path, const char *field, struct ukvm_remote_key *key,
			 struct ukvm_error *err)
{
	char text[AUTH_KEY_FILE_MAX + 1];
	size_t got = 0;
	struct stat st;
	ssize_t n;
	int fd, ret = 0;

	memset(err, 0, sizeof(*err));
	memset(key, 0, sizeof(*key));
	/* O_NONBLOCK: a FIFO put there would hold the open. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return ukvm_err_set(err, UKVM_ERR_CONFIG, errno, "%s: open(\"%s\")%s", field, path,
				    errno == ENOENT ? ": no such key file; make one with "
				    "`uffdkvm serve --new-key PATH ...` or `(umask 077; openssl "
				    "rand -hex 32 > PATH)`" : "");
	if (fstat(fd, &st)) {
		ret = ukvm_err_set(err, UKVM_ERR_CONFIG, errno, "%s: fstat(\"%s\")", field, path);
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = ukvm_err_set(err, UKVM_ERR_CONFIG, EINVAL, "%s: %s is not a regular file; "
				   "give a key file (64 to 128 hex digits)", field, path);
		goto out;
	}
	if (st.st_uid != geteuid()) {
		ret = ukvm_err_set(err, UKVM_ERR_CONFIG, EPERM, "%s: %s belongs to uid %u, not to "
				   "this user (uid %u): a key must be its user's own; chown %u %s",
				   field, path, (unsigned)st.st_uid, (unsigned)geteuid(),
				   (unsigned)geteuid(), path);
		goto out;
	}
	if (st.st_mode & 077) {
		ret = ukvm_err_set(err, UKVM_ERR_CONFIG, EPERM, "%s: %s has mode %04o: others may "
				   "read the key, so it is refused; chmod 600 %s", field, path,
				   (unsigned)(st.st_mode & 07777), path);
		goto out;
	}
	while (got < sizeof(text)) {
		n = read(fd, text + got, sizeof(text) - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = ukvm_err_set(err, UKVM_ERR_CONFIG, errno, "%s: read(\"%s\")", field,
					   path);
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	if (got > AUTH_KEY_FILE_MAX || ukvm_auth_key_parse(text, got, key))
		ret = ukvm_err_set(err, UKVM_ERR_CONFIG, EINVAL, "%s: %s does not hold a key: "
				   "expected %u to %u hex digits (%u to %u random bytes) and "
				   "nothing else but a newline; make one with `(umask 077; openssl "
				   "rand -hex 32 > %s)`", field, path, 2 * UKVM_REMOTE_KEY_MIN,
				   2 * UKVM_REMOTE_KEY_MAX, UKVM_REMOTE_KEY_MIN,
				   UKVM_REMOTE_KEY_MAX, path);
out:
	explicit_bzero(text, sizeof(text));
	close(fd);
	return ret;
}

static int auth_nonce(uint8_t nonce[UKVM_REMOTE_NONCE_LEN])
{
	size_t got = 0;

	while (got < UKVM_REMOTE_NONCE_LEN) {
		ssize_t n = getrandom(nonce + got, UKVM_REMOTE_NONCE_LEN - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		got += (size_t)n;
	}
	return 0;
}

static bool auth_keyed(const struct ukvm_remote_key *key)
{
	return key && key->len;
}

/* HMAC-SHA256(key, label || first || second) into mac. */
static int auth_mac(const struct ukvm_remote_key *key, const char *label, const uint8_t *first,
		    const uint8_t *second, uint8_t mac[UKVM_REMOTE_MAC_LEN])
{
#ifdef UKVM_HAVE_LIBCRYPTO
	uint8_t msg[64 + 2 * UKVM_REMOTE_NONCE_LEN];
	size_t n = strlen(label);
	unsigned int len = 0;

	_Static_assert(sizeof(UKVM_REMOTE_LABEL_CLIENT) <= 64 &&
		       sizeof(UKVM_REMOTE_LABEL_SERVER) <= 64, "labels fit msg");
	memcpy(msg, label, n);
	memcpy(msg + n, first, UKVM_REMOTE_NONCE_LEN);
	memcpy(msg + n + UKVM_REMOTE_NONCE_LEN, second, UKVM_REMOTE_NONCE_LEN);
	if (!ukvm_remote_auth_available()) {
		memset(mac, 0, UKVM_REMOTE_MAC_LEN);
		return -EOPNOTSUPP;
	}
	if (!crypto.hmac(crypto.sha256(), key->bytes, (int)key->len, msg,
			 n + 2 * UKVM_REMOTE_NONCE_LEN, mac, &len) || len != UKVM_REMOTE_MAC_LEN)
		return -EIO;
	return 0;
#else
	(void)key; (void)label; (void)first; (void)second;
	memset(mac, 0, UKVM_REMOTE_MAC_LEN);
	return -EOPNOTSUPP;
#endif
}

/* Whether two macs are the same, in time that does not depend on where they differ. */
static bool auth_same(const uint8_t *a, const uint8_t *b)
{
#ifdef UKVM_HAVE_LIBCRYPTO
	return crypto.loaded && crypto.memcmp(a, b, UKVM_REMOTE_MAC_LEN) == 0;
#else
	(void)a; (void)b;
	return false;
#endif
}

int ukvm_auth_hello_make(struct ukvm_remote_hello *hello, bool keyed)
{
	memset(hello, 0, sizeof(*hello));
	hello->magic = UKVM_REMOTE_MAGIC;
	hello->version = UKVM_REMOTE_VERSION;
	hello->flags = keyed ? UKVM_REMOTE_KEYED : 0;
	return auth_nonce(hello->nonce);
}

int ukvm_auth_hello_check(const void *buf, size_t len, struct ukvm_remote_hello *hello)
{
	if (len != sizeof(*hello))
		return -EPROTO;
	memcpy(hello, buf, sizeof(*hello));
	if (hello->magic != UKVM_REMOTE_MAGIC || hello->version != UKVM_REMOTE_VERSION ||
	    hello->flags & ~UKVM_REMOTE_KEYED)
		return -EPROTO;
	return 0;
}

int ukvm_auth_answer_make(const struct ukvm_remote_key *key, const struct ukvm_remote_hello *hello,
			  struct ukvm_remote_auth *auth)
{
	int ret;

	memset(auth, 0, sizeof(*auth));
	auth->magic = UKVM_REMOTE_MAGIC;
	auth->version = UKVM_REMOTE_VERSION;
	ret = auth_nonce(auth->nonce);
	if (ret || !(hello->flags & UKVM_REMOTE_KEYED))
		return ret;
	if (!auth_keyed(key))
		return -EACCES;
	return auth_mac(key, UKVM_REMOTE_LABEL_CLIENT, hello->nonce, auth->nonce, auth->mac);
}

int ukvm_auth_answer_check(const struct ukvm_remote_key *key,
			   const struct ukvm_remote_hello *hello, const void *buf, size_t len)
{
	struct ukvm_remote_auth auth;
	uint8_t want[UKVM_REMOTE_MAC_LEN];
	int ret;

	if (len != sizeof(auth))
		return -EPROTO;
	memcpy(&auth, buf, sizeof(auth));
	if (auth.magic != UKVM_REMOTE_MAGIC || auth.version != UKVM_REMOTE_VERSION || auth.flags)
		return -EPROTO;
	if (!(hello->flags & UKVM_REMOTE_KEYED))
		return 0;
	if (!auth_keyed(key))
		return -EACCES;	/* a keyed hello from a server without a key: never sent */
	ret = auth_mac(key, UKVM_REMOTE_LABEL_CLIENT, hello->nonce, auth.nonce, want);
	if (!ret && !auth_same(want, auth.mac))
		ret = -EACCES;
	explicit_bzero(want, sizeof(want));
	return ret;
}

int ukvm_auth_welcome_make(const struct ukvm_remote_key *key,
			   const struct ukvm_remote_hello *hello,
			   const struct ukvm_remote_auth *auth, int32_t status,
			   struct ukvm_remote_welcome *welcome)
{
	memset(welcome, 0, sizeof(*welcome));
	welcome->magic = UKVM_REMOTE_MAGIC;
	welcome->status = status;
	if (status || !(hello->flags & UKVM_REMOTE_KEYED))
		return 0;
	if (!auth_keyed(key))
		return -EACCES;
	return auth_mac(key, UKVM_REMOTE_LABEL_SERVER, auth->nonce, hello->nonce, welcome->mac);
}

int ukvm_auth_welcome_check(const struct ukvm_remote_key *key,
			    const struct ukvm_remote_hello *hello,
			    const struct ukvm_remote_auth *auth, const void *buf, size_t len)
{
	struct ukvm_remote_welcome welcome;
	uint8_t want[UKVM_REMOTE_MAC_LEN];
	int ret;

	if (len != sizeof(welcome))
		return -EPROTO;
	memcpy(&welcome, buf, sizeof(welcome));
	if (welcome.magic != UKVM_REMOTE_MAGIC)
		return -EPROTO;
	if (welcome.status == -EACCES)
		return -EACCES;
	if (welcome.status)
		return -EPROTO;
	if (!(hello->flags & UKVM_REMOTE_KEYED))
		return auth_keyed(key) ? -EKEYREJECTED : 0;
	if (!auth_keyed(key))
		return -EACCES;
	ret = auth_mac(key, UKVM_REMOTE_LABEL_SERVER, auth->nonce, hello->nonce, want);
	if (!ret && !auth_same(want, welcome.mac))
		ret = -EKEYREJECTED;
	explicit_bzero(want, sizeof(want));
	return ret;
}
