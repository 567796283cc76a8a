/// RSA keys at and just over `RS256PrivateKey`'s 4096-bit bound, made once with `openssl genpkey -algorithm RSA
/// -pkeyopt rsa_keygen_bits:<bits>` (and `openssl pkey -pubout`) for these tests only. Generated at test time they
/// took 5–15 s of CPU each on the 2-core machine, in synchronous tests that held the test process's cooperative
/// threads: every other test in the process stalled for 30 s and failed on its deadline.
enum LargeRSAKeys {
    static let private4160 = """
        -----BEGIN PRIVATE KEY-----
        MIIJZgIBADANBgkqhkiG9w0BAQEFAASCCVAwgglMAgEAAoICCQCrpa73naNS2mta
        XRGjY23Ilz8lvuVAKbbCHFURtv7tqB3WIo7MFLDWsMDxm/1VeqJHLGpCmaiQRd2A
        RaPoE0AW3V48EI4vw4qK/+PTyU7VcSkBj3kuExjZFEPAVvACCmqgts+tW+5kA3td
        0kM/ZievBWUW/HgnzgfyB15Ac+yAFE9l9BGtr0AZOA1nyoQ4xwsYh5O+t33lXst4
        bcBhlvrvEeaXGy2DJjG6DY2JFldW44Co1QOUYWTgmVv8DWcFEANBtcbZLub2FYZ2
        8S/gMfxycvcnOaFCk9fand7k8GLCcwhuSr6RA2PdqLhoiHsYzm8LW+ySuVINga3o
        +kpaRfSXgi9wzBQ71k81m0954+7i9TJ8a/MfEhgn14CHED2V+toNo57UMkIR/PwG
        GgYdP8KmmXkfgXkpIofRp1jFNYazkqPtnOhYRg09d2Hrj9rpifF8eS4r8U7QNa2R
        UJiDoJ64QK5FXgQhq3HJJLkL31kWxxHssTpgcPz8GPK8riMe8YVqcb4l1N0V70hq
        eqYIyYLh0E97cP+S1rTFhT78sq87vrUfXrhs3A+KBZjg+tRutXwlZ194Fv4o3jhp
        XjRxF2PO3HhVJqEmIMweja962VWVf91Cg3U7sGIUUaGfLEUyK5HX2oDeX+wkNOX3
        ZNExMehK4oY4K9lLhauHa0i0xCB+DjK48BSUxWJLAgMBAAECggIIQQImKyfr9HQ+
        1mGLTZtZt+/4fZ44Cz4BNrEuUuBA2teiPTinZomrlBQrbxZKMzaYAWbD8+doXQPo
        6Sz27+1ih4Zdq1gF0fc4IH7b1ZlXnyUVh77EAXxAG+893bnPeqZhTe8O5rR7rCtZ
        bOY2i+tvuizL5ZHHHCQ/BB5gRv7gon2OuKlgjKxkFWkSQq4Dt9FC1Y57mW67YsSt
        QTYn944MCcF42N/1M8eia7m4UiRA/ep6DvdmPKtKXnoWyXZ1/wfag+eJoTXPSYJL
        g/7CyCGGX/5EtvlvptyBkw3ZnlGgxc51cfgjBp8HEqtU9FpEbNe6XM364nMHrY/g
        wu0QffIiucMXnps9Shl6aHVsLTfl4GALrUtATVTjQju34c0WDDPclJi30oz7oK6g
        Irt72bIp7q03QpDmK93vj5fqQr+3rvC4EOdiyWDN5SzC0ivrtnhO/oLI+hmUKvxm
        VvGwQcNVZnpe/SeHaYEnEOL/WACdf482RygjFBxDGLdSHzAoF7WPTv1zAW3ijiwi
        RX7U2m9kcfKF2bKjLxcJXMEwwZTY6+q73w1r2L4MQQ0obNN71TgcKIgajPovqpsh
        4JHulYot9knetnZfptKQd3sCMFmmWsbMl2hfBGS9HyCL8JwwHKzRVrH0+DgWe/5i
        GX27rRIudW4Hw2ustIvyS5iXP5/IQvA51nS6zcZ+cQKCAQUA3OJzwEgNR0JohYYw
        TqQcsDga0iHawd7A2D/f1qsIkPR1cg/uMyMjMybtKe6I5o+5dpHSk1QT6tDCB3bc
        mCvH06PNC4swcxT8d3KLfeoJBXvONRWdfKWwXpVx5p7Q/zAEPveKJg+duH5Bu+0F
        +ly9Xwe/McY3q2f4Sz4UHDE+5wtLbw1Hl6uEHnEFrXvy4bE83oqnNPx3PrbavZ27
        GT6caWGEvBPf96I46+yWdELBaC3bhxHt/XMQx8OHaSNSYz5bR39dQi0LFwlDcmNy
        51yhkhSJ2By/8nWfkOypRnSIVvR3537mH+CtmhShnhEM1AhwgTjk1/G7wzFdkgw1
        9CtfBk1YkFkCggEFAMbvXxEmt0VHRZUm88a3FEKOS7o/ttDQlgbROQykbPJtEfjd
        WSD5NGmQKfF2A2mmG+/FTPhNGzEzERaQwSdkT+F33MerwICYG4BmxSHzObzwwgi8
        dJg7DXKm4xio16SG4/WmTY6UI5WpFPXpdfJwYKpdCx6w45HqVztA8SQn/2JvRsrO
        Z9fW2UvvTm6rIhHRqnNhay5EUfGEHMCrj0qgr7bE23zZlr9KH88bvHpktAXc02Gr
        faYYWbTr7sTBOIfg9IWbZU79LjYD08NnYccfX0S0J1aNzdLWFrIt4XMsatPdC1tA
        EX+Nupi0BiFoYEf9jOjoaCyWbe1Ui2NrEEA3gIUeyRNDAoIBBDtEpAx3COETB5q0
        W+fuDyiVlVTG8rzMeXBNC1G9iMnkXlMhxSeBiSNjkYWL1L4Q2JHhJOCVUdbS9w0r
        rptCPBckv5MWYQSwH+IpIRbDInKPOtBxoVVd3Ao1DV/1Q10F1E3U/AOkcwybDCZR
        viXkloeWO44ugqeCeVQvLxQ1foxeMnp01L30rrnAV+ap+Izoks2f5KfKCnEQfXcd
        iKOIck2wdf5FUvZOV/mt/NzrQJwkmeAPRo2YP2tqor3qVWP9yl5P5YUpMu2WdbuO
        xbkg2NWqnyYW6MY1G4C2j+EwyZiTdkzudu8cyVgrqwYPyyJltVJnIrhyy4/fghz7
        G8sNjCzTuizZAoIBBED3Btq5A/yxy71rnQx12T3q7jwCdpc2pufPB4xjXdjFWasl
        zeeAumcG10utOGwV/OWOTxZ/R7QHczslRo6wqY198TGbmx/jjIegCByQK3jSPutP
        b9wO3NNmQJ9a9CEck/Eyv/0hz4UeVGQCO6xSmp7IB8ucBJUwLBCDorwl+7aPlFTC
        lxLbbNbpbXmilVuwVrObSr8vPHtco28gF4lNdFSBcRQSkrIhaMXfzutBW7DWbolk
        0YGeTh1RNwY1+1oUUoYXOzxSXfbxxQP5DOtUCW6MTpRrdp21oG/Ln+ZWyQQrGXxR
        LeWzyQ35LE9YoKih2pRs4Sg+b+OjSmnLGuF9vpC6fvu1AoIBBQCXpkNwK4oXbzG9
        62MYTBTDDEj86If+S5h3s48/iMLW8kaWd8n6FwaWoLpyN44zVZSs+7oBNYOK73Md
        MCcwC9HK4x/70bcjNIuemMzcbyAmrucGHWWHsUCEKePbihszRQ5D3ZahGtk33brn
        0iU+O4IlZpHpFrTLuROj8daStQAdbj4WVjXnT+VY+wFOvRZQ/RdHK1Axarl1ItWE
        cBHnkvxsDH8MuFhwUGhrfwVylYPatrGvbTs1eWCI0pkurhcJZgvnihfumEP9CPBn
        co7ubrYG92K6sB9L0dYl6Vb+FsRLVvUOzWB6JELvYoo0a8XYLa8w1JG2XNgagBrA
        quPne0B2wzw8Zw==
        -----END PRIVATE KEY-----
        """

    static let public4160 = """
        -----BEGIN PUBLIC KEY-----
        MIICKjANBgkqhkiG9w0BAQEFAAOCAhcAMIICEgKCAgkAq6Wu952jUtprWl0Ro2Nt
        yJc/Jb7lQCm2whxVEbb+7agd1iKOzBSw1rDA8Zv9VXqiRyxqQpmokEXdgEWj6BNA
        Ft1ePBCOL8OKiv/j08lO1XEpAY95LhMY2RRDwFbwAgpqoLbPrVvuZAN7XdJDP2Yn
        rwVlFvx4J84H8gdeQHPsgBRPZfQRra9AGTgNZ8qEOMcLGIeTvrd95V7LeG3AYZb6
        7xHmlxstgyYxug2NiRZXVuOAqNUDlGFk4Jlb/A1nBRADQbXG2S7m9hWGdvEv4DH8
        cnL3JzmhQpPX2p3e5PBiwnMIbkq+kQNj3ai4aIh7GM5vC1vskrlSDYGt6PpKWkX0
        l4IvcMwUO9ZPNZtPeePu4vUyfGvzHxIYJ9eAhxA9lfraDaOe1DJCEfz8BhoGHT/C
        ppl5H4F5KSKH0adYxTWGs5Kj7ZzoWEYNPXdh64/a6YnxfHkuK/FO0DWtkVCYg6Ce
        uECuRV4EIatxySS5C99ZFscR7LE6YHD8/BjyvK4jHvGFanG+JdTdFe9IanqmCMmC
        4dBPe3D/kta0xYU+/LKvO761H164bNwPigWY4PrUbrV8JWdfeBb+KN44aV40cRdj
        ztx4VSahJiDMHo2vetlVlX/dQoN1O7BiFFGhnyxFMiuR19qA3l/sJDTl92TRMTHo
        SuKGOCvZS4Wrh2tItMQgfg4yuPAUlMViSwIDAQAB
        -----END PUBLIC KEY-----
        """

    static let private4096 = """
        -----BEGIN PRIVATE KEY-----
        MIIJQgIBADANBgkqhkiG9w0BAQEFAASCCSwwggkoAgEAAoICAQC7EUHdbpkerdjd
        6Trzdc2wbQgS0789579wdZFC/ntkxUUPP0Q+fAhu7xMHOkzROyoj5yEJ53GZNv7a
        NZHeuDHmxVPu1Dc1B1J3gMOQvU8z1/Y65xkgdxx9fYsYOK4PYpUd911fyDq8fx1R
        OExbGjwnQt9EnX3mxvU//Zz8yJ9kAzsfNKKCZ+J+F3azMuaFZ6XvdrlJ88fm34S8
        p1JXxFf4RtVUkSdDDul54yb8GQkGrImat1C3V/wC2k5ydmw7jZzJqgGMP5tdLCOs
        hCcPUrQjbv7U0SV/xydRItdNwpxo2LGlhwUwjv7RSQLKtjgQOPjKqw8XrDPALWNx
        ykusZR7qo/AZrqR4Oz8vyJj080pIsbyHyepk4i+//SwlvwKmQh765gSIZ1jl0Lyi
        I7p2P72RlW8ioDm+EgelDul2/uufOj6wsMS4AvVEzR5nVcXJt4LXPF29kB6A/5go
        6AG3OExSDqDBs25LVufOqHZs4d91KxIonTHJEeQa4PuILD57fobjNOEWkxZTe6Nu
        Ckl4NiqKjGKHH7NwQx+LVQRWAYWWaQ7zqRH6u1nB8HWDjt2BHgV89XxCCShe7DVb
        JAj5gFrpvaG+z2qFelBL1jkVOpWL4qPEK5YJ8Bsuo4+SbTqlplMjljoTQHVayuor
        f0k9SVPfHiRDRR9jjPtda9jGILaz2QIDAQABAoICAAZFNhC6zhGf8KrBkFsMShR9
        lx1wcRLdY4acvj2BY7f1P9MawwoYJL05MMlXfC8wPUGeU/ZtxlpFJGZCkOzm/i82
        0pEpFl+l6u78BzIhElhRxxxi1i4HKBKRxHmPns//tTFfswbMoqFiXmR0T2TnXHhR
        bsPxRoDXju1x7hLwE52p2Q+69y6JVmd1GGK51E3I82AzOdM/g2Ya/GtJbYJpH6zA
        DRMMWYVPKObPxSUCntGVM3iW5/L5VUZwNFx0WTzmyohc9TfTAv1sxxZXiKqkEks0
        w4B1MT1W+tumoBJocU83Yj8C51rhFCwGNzx9vqPWkQpUEQmxWTu6GcD876vr6M0U
        dzax+WusXYZJi9h4qgbvaQnK0HPzINwGIQQ6UfSsIoPQ5/cmfOpk2ZiEbuZAW7gK
        FH9g2Dlr/5UPG0SMcoW6GCT9CcypgX1RrEFWr42sc1QE++zkNpgXo5eTaJacne+1
        F18oUjqofxIXhhC2vN3zVrXQkIleH6Vu5gKjbZWT2bW4TVjciIhR2I9L+tVuUC03
        crbD0iTI1puSrayGDJTMmMVMetVmbowRZx2L+jYnVylGfeB0NujHlji3wTqKXINO
        LoSVDjyfo+KCNY29B5U3EQ4LjiDOTfkr9Y6Q2X6x1o7fKuw55FZq9OAxQ7XRwCmC
        xzPpdfMdChN4VYiSxp+NAoIBAQDn2+LetVMMwGcmrKouTWSzrrbcnkIMgx6OXGgk
        Z+JtvHhukZo1wdhM+LScOHVRsjTLJrJKQczreDpQILnnOi2Y930CEBseeI3AOsEd
        Y41QnsSvF1997ZJ1323aNkEycbE2qXejrHHJpkeyhw0TGd1fFqqfe59DAivMVKzW
        8R7AdJzCCdzuUFhNKUswuJmPVzqagtk1YOcvZuX0JcYa5ndI8u9U9O/nHqt2R5d6
        sjei8HZWHw4t7+PRysbztNA7/7LGTYv3/24Z3ePyWvRJPrSFP2jWNloEfpSwxP2S
        xQaEczEiTrpwcxZfNw+MsBMycfJyf/9o+5vL6HOtIvx5Cz9FAoIBAQDOi3hBGyZB
        YU+/XKje+buIWx0wCzlYggxTn/LSUP+pAvwyiyJZUjGjlLAkBmzP3XWT08qVAJ86
        qYOpcvq3BLeu/G89dRtMXHR9Tvo4ZXUCO5+cdchsRmWjt3tlaRo6HV2R8qg6p9Xp
        s1BpMyQqEXcGuhGNNq5ZU1ENjLglhpSoepEHtRcazq4i7MpseSLO18uiDgkopouk
        lntzT8DKb9Nis5V5TVTMXuwuPCU6kRDWnQntC+zYpMW+rGLWsJkSltyR57PAKVCr
        HcEdzs9yA/wkwNgSfb2QGT05EJ3WZxuVNzywXfjlYsB/PlKsiuEGqDV0O65iOvZX
        NUo/P6kMElGFAoIBAAm8cgpoEtS2P56gIYVQOqpQ69zXyG4+E0pnFvhwZFG3WFdM
        Re179llFGFB3DnYfxZfCSDpWCQTaR5iVxziueLuzqMwtYPYmmc04qmNRit2XzSqN
        ELV5BG1utG41WQeFPqvM8fkthJmzIc+dXC8xJtqXWRLZXhayQKST6a4c8e2i9/It
        99kKBqs20LF7Dve18gAK/pP/PbX/3Cgkbe0zQE8P5HzszCYoY4rT9shwM2XkMxPq
        ue2z5R0qJrCVJyld02QAXaBMWZM8fhXvO9LXjz0JLJ3SKnWF2ziRDRTcsSlerPGD
        3NBcBNR6u2xs+GFl54hnV5JQ/nnRiQn8Lh3nGwECggEBAMGwhNr5LMzPBsv7htli
        8/wRBbQSMnrPqeOZ8UpNbxL9m6eCVnnQ3H/8ZZnC9LORiDtSt303khqe8Lss+fQ7
        Vk2gqGjHswvO/+aq83eDnVC0vR8qTQNMmPAIlo0pHNE2zJKbLiujTLTV1ShyLw3M
        RwRl5SO6DZHy0eWU+vMl266LEgpaRgp7m01hJQrIJl42e93Cr9ARLo7wF2Cxf6fX
        ajH7GscgP89PjMhm2rqrY1D+/1nufvNCwbXnTuDpxwJpuvqQgD5KAD4XrwvW7y6K
        kh+dQINGq0fAg2tKK9nt4y3xGNaDqW7jRoWM2la3/gISJ96SQRwZEv4BGVlqx4ps
        e0kCggEADtjVan5ZstSGQY3F0xZZ6HrEVn1b+8W6Ah2957k/EQLTkMRLGPIUAnRg
        9+w2Kw5+lqRtkzxgl5oZZ3TXfXyEWLnnCXakLfANS1sdD89Ux6lktLAP1UrwSVKj
        zXR1stMqct7yWVPVgzSXC9zx8/Y0lrCm32vZA8ZQnVkRGpDsCcr2wKKrXKlSqoEI
        SNyHoF3a9Kr8G1yggKgIVTHX8Rai9m3ngatZwjDHK1Tg1IHS02X6JolMtPBfGsAD
        c+kib7OL7JgSg2UMl8wJvHyKTZjRkevVlOcWf4If2+kI+ViOVVd+SUvIBTJqnwKf
        7uJLGLauo1flcoyVdZ0hR2fDf1FZMg==
        -----END PRIVATE KEY-----
        """

    static let public4096 = """
        -----BEGIN PUBLIC KEY-----
        MIICIjANBgkqhkiG9w0BAQEFAAOCAg8AMIICCgKCAgEAuxFB3W6ZHq3Y3ek683XN
        sG0IEtO/Pee/cHWRQv57ZMVFDz9EPnwIbu8TBzpM0TsqI+chCedxmTb+2jWR3rgx
        5sVT7tQ3NQdSd4DDkL1PM9f2OucZIHccfX2LGDiuD2KVHfddX8g6vH8dUThMWxo8
        J0LfRJ195sb1P/2c/MifZAM7HzSigmfifhd2szLmhWel73a5SfPH5t+EvKdSV8RX
        +EbVVJEnQw7peeMm/BkJBqyJmrdQt1f8AtpOcnZsO42cyaoBjD+bXSwjrIQnD1K0
        I27+1NElf8cnUSLXTcKcaNixpYcFMI7+0UkCyrY4EDj4yqsPF6wzwC1jccpLrGUe
        6qPwGa6keDs/L8iY9PNKSLG8h8nqZOIvv/0sJb8CpkIe+uYEiGdY5dC8oiO6dj+9
        kZVvIqA5vhIHpQ7pdv7rnzo+sLDEuAL1RM0eZ1XFybeC1zxdvZAegP+YKOgBtzhM
        Ug6gwbNuS1bnzqh2bOHfdSsSKJ0xyRHkGuD7iCw+e36G4zThFpMWU3ujbgpJeDYq
        ioxihx+zcEMfi1UEVgGFlmkO86kR+rtZwfB1g47dgR4FfPV8QgkoXuw1WyQI+YBa
        6b2hvs9qhXpQS9Y5FTqVi+KjxCuWCfAbLqOPkm06paZTI5Y6E0B1WsrqK39JPUlT
        3x4kQ0UfY4z7XWvYxiC2s9kCAwEAAQ==
        -----END PUBLIC KEY-----
        """
}
