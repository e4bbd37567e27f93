/* Everything the module asks and tells a person in its own words, in one place. (What the daemon
 * says, its `message`, `reason` and `hint` fields, is shown as it comes, sanitised.) */

#ifndef KIOSKAUTH_PAM_MESSAGES_H
#define KIOSKAUTH_PAM_MESSAGES_H

#define PROMPT_NAME "Name: "
#define PROMPT_PASSCODE "Passcode: "
#define PROMPT_OLD_PASSCODE "Current passcode: "
#define PROMPT_NEW_PASSCODE "New passcode: "
#define PROMPT_RETYPE_PASSCODE "Retype new passcode: "
#define PROMPT_ACTIVATION_OFFER "Enter your activation code, or press Enter to skip: "
#define PROMPT_ACTIVATION_CODE "Activation code: "
#define PROMPT_CHOOSE_PASSCODE "Choose a passcode (6 digits): "
#define PROMPT_CONFIRM_PASSCODE "Type the same passcode again: "
#define PROMPT_ENABLE_FINGERPRINT "Enable fingerprint login? [y/N] "
#define PROMPT_EMAIL "Email: "
#define PROMPT_PASSWORD "Password: "
#define MESSAGE_NOT_RECOGNISED "Fingerprint not recognised."
#define MESSAGE_WRONG_PASSCODE "Wrong passcode."
#define MESSAGE_SCAN_TIMED_OUT "Fingerprint timed out: no finger was placed on the reader."
#define MESSAGE_USE_PASSCODE "Too many tries with the finger: use your passcode."
#define MESSAGE_USE_NAME "Too many tries with the finger: use your name and passcode."
#define MESSAGE_HARD_LOCKED                                                                        \
    "Your passcode is locked. Ask an administrator to reset it, or sign in online."
#define MESSAGE_IDP_FALLBACK "Biometric login failed. Please sign in with your email and password."
#define MESSAGE_SIGN_IN "Please sign in with your email and password."
#define MESSAGE_SIGN_IN_ONLINE "Sign in online: your organisation's sign-in must be renewed."
#define MESSAGE_WRONG_CREDENTIALS "Wrong email or password."
#define MESSAGE_NOT_AN_EMAIL "That is not an email address."
#define MESSAGE_IDP_UNAVAILABLE                                                                    \
    "Your organisation's sign-in cannot be reached. Try again later, or use your finger or "       \
    "passcode."
/* The same, to someone who must sign in online before their finger or passcode works again. */
#define MESSAGE_IDP_UNAVAILABLE_ONLINE_ONLY                                                        \
    "Your organisation's sign-in cannot be reached, and you must sign in online before your "      \
    "finger or passcode works again. Try again when this terminal is back online, or ask your "    \
    "coordinator."
#define MESSAGE_IDP_BROKEN "Online sign-in is not working on this terminal. Ask an administrator."
#define MESSAGE_NOT_ADMITTED "Your account may not sign in on this terminal."
#define MESSAGE_UNKNOWN_ROLE "Your account has no role this terminal knows. Ask your coordinator."
#define MESSAGE_OTHER_PERSON "You signed in as someone else. Sign in with your own account."
#define MESSAGE_ONLINE_NOT_HERE "Online sign-in is not possible here."
#define MESSAGE_LOGIN_PAUSED "Too many wrong passwords on this terminal."
#define MESSAGE_DEVICE_DENIED "The sign-in was declined."
#define MESSAGE_DEVICE_EXPIRED "The sign-in code expired before it was used."
#define MESSAGE_UNAVAILABLE "The login service is not available."
#define MESSAGE_NOT_THIS_ACCOUNT "Not allowed on this account."
#define MESSAGE_NOT_SET_UP                                                                         \
    "Your account is not set up yet. Enter the activation code you were given."
#define MESSAGE_CODE_WRONG "That code is not right. Check it and try again."
#define MESSAGE_ALREADY_ACTIVE                                                                     \
    "This account is already set up: log in with your finger or passcode."
#define MESSAGE_ENROLLED "Finger enrolled. Next time, just touch the reader."
#define MESSAGE_ENROL_LATER "You can turn on fingerprint login later: ask your coordinator."
#define MESSAGE_NOT_ENROLLED "The finger could not be enrolled."
#define MESSAGE_NO_FINGER_HERE "Your fingerprint is not set up on this terminal's reader yet."

#endif
