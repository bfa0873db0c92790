//! The image user as CRI ImageStatus reports it.

/// `uid` when the user part of the image's `User` is numeric, else
/// `username`; the group part is ignored (containerd's getUserFromImage).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageUser {
    pub uid: Option<i64>,
    pub username: String,
}

pub fn image_user(user: &str) -> ImageUser {
    if user.is_empty() {
        return ImageUser::default();
    }
    let user = user.split(':').next().unwrap_or_default();
    // Rust's i64 parser accepts the same forms as Go's strconv.ParseInt
    // base 10 (optional sign, digits), which containerd uses here.
    match user.parse::<i64>() {
        Ok(uid) => ImageUser {
            uid: Some(uid),
            username: String::new(),
        },
        Err(_) => ImageUser {
            uid: None,
            username: user.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(n: i64) -> ImageUser {
        ImageUser {
            uid: Some(n),
            username: String::new(),
        }
    }

    fn name(s: &str) -> ImageUser {
        ImageUser {
            uid: None,
            username: s.into(),
        }
    }

    #[test]
    fn like_containerd() {
        assert_eq!(image_user(""), ImageUser::default());
        assert_eq!(image_user("1002"), uid(1002));
        assert_eq!(image_user("0"), uid(0));
        assert_eq!(image_user("1002:1002"), uid(1002));
        assert_eq!(image_user("1002:group"), uid(1002));
        assert_eq!(image_user("www-data"), name("www-data"));
        assert_eq!(image_user("www-data:www-data"), name("www-data"));
        assert_eq!(image_user("www-data:1004"), name("www-data"));
        assert_eq!(image_user(":1004"), name(""));
        assert_eq!(
            image_user("99999999999999999999"),
            name("99999999999999999999")
        );
    }
}
